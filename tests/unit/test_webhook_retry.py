"""The project's one backoff helper and Retry-After parser."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from genhook.retry import backoff_delay, parse_retry_after


def test_doubling_without_jitter() -> None:
    delays = [backoff_delay(n, 10, 1800, jitter=0) for n in range(1, 11)]
    assert delays == [10, 20, 40, 80, 160, 320, 640, 1280, 1800, 1800]


def test_jitter_stays_within_bounds_and_varies() -> None:
    rng = random.Random(7)
    samples = [backoff_delay(3, 10, 1800, jitter=0.2, rng=rng) for _ in range(500)]
    assert all(32 <= s <= 48 for s in samples)
    assert len({round(s, 3) for s in samples}) > 100
    capped = [backoff_delay(40, 10, 1800, jitter=0.5, rng=rng) for _ in range(200)]
    assert all(900 <= s <= 1800 for s in capped)


def test_huge_attempt_numbers_stay_finite() -> None:
    assert backoff_delay(10_000, 10, 60, jitter=0) == 60


@pytest.mark.parametrize("bad", [0, -1])
def test_attempts_start_at_one(bad: int) -> None:
    with pytest.raises(ValueError):
        backoff_delay(bad, 10, 60)


def test_retry_after_forms() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("120") == 120
    assert parse_retry_after(" 0 ") == 0
    assert parse_retry_after("Thu, 01 Jan 2026 12:01:30 GMT", now=now) == 90
    assert parse_retry_after("Thu, 01 Jan 2026 11:00:00 GMT", now=now) == 0
    assert parse_retry_after("soon") is None
    assert parse_retry_after("-5") is None
    assert parse_retry_after(None) is None
