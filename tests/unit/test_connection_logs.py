"""Floods of refused connections and bad requests log a line per interval, not per event."""

from __future__ import annotations

import logging

import pytest

from genhook.api.connections import RateLimitedLog, RepeatFilter


def test_rate_limited_log_counts_what_it_left_out(caplog: pytest.LogCaptureFixture) -> None:
    limited = RateLimitedLog(logging.getLogger("test.flood"), interval=3600)
    with caplog.at_level(logging.WARNING, logger="test.flood"):
        for _ in range(1000):
            limited.warning("accept", "accept failed")
        limited.warning("timeout", "timed out")
    assert [r.getMessage() for r in caplog.records] == ["accept failed", "timed out"]
    limited.interval = 0
    with caplog.at_level(logging.WARNING, logger="test.flood"):
        limited.warning("accept", "accept failed")
    assert caplog.records[-1].getMessage() == "accept failed (999 more like this not logged)"


def test_repeat_filter_passes_each_message_once_per_interval() -> None:
    repeat = RepeatFilter(interval=3600)

    def record(message: str, level: int = logging.WARNING) -> logging.LogRecord:
        return logging.LogRecord("uvicorn.error", level, __file__, 1, message, None, None)

    passed = [repeat.filter(record("Invalid HTTP request received.")) for _ in range(500)]
    assert passed.count(True) == 1
    assert repeat.filter(record("another warning"))
    assert all(repeat.filter(record("started", logging.INFO)) for _ in range(3))
    repeat.interval = 0
    again = record("Invalid HTTP request received.")
    assert repeat.filter(again)
    assert "499 more like this not logged" in again.getMessage()
