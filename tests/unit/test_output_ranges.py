"""Parsing of HTTP Range headers on outputs (RFC 9110 section 14.1.2)."""

from __future__ import annotations

import pytest

from genhook.api.ranges import byte_range


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("", None),
        ("bytes=0-99", (0, 99)),
        ("bytes=0-0", (0, 0)),
        ("bytes=900-", (900, 999)),
        ("bytes=900-5000", (900, 999)),
        ("bytes=-100", (900, 999)),
        ("bytes=-5000", (0, 999)),
        ("BYTES = 10 - 20", (10, 20)),
        ("bytes=1000-", False),
        ("bytes=-0", False),
        ("bytes=20-10", None),
        ("bytes=0-1,5-6", None),
        ("items=0-10", None),
        ("bytes=-", None),
        ("bytes=abc", None),
    ],
)
def test_byte_range(header: str | None, expected: object) -> None:
    assert byte_range(header, 1000) == expected


def test_an_empty_output_has_no_satisfiable_suffix() -> None:
    assert byte_range("bytes=-10", 0) is False
    assert byte_range("bytes=0-", 0) is False
