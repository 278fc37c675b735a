"""``zoned_time_ms``: the one reader of an ISO 8601 time on the wire (a task list's and a
bulk redelivery's ``since``)."""

from __future__ import annotations

import pytest

from genhook.errors import InvalidRequest, zoned_time_ms


@pytest.mark.parametrize(
    "text",
    [
        "2026-11-22T08:00:00Z",
        "2026-11-22t08:00:00z",
        " 2026-11-22T08:00:00+00:00 ",
        "2026-11-22T09:30:00+01:30",
        "2026-11-22T08:00:00.000Z",
    ],
)
def test_a_zoned_time_reads_as_unix_milliseconds(text: str) -> None:
    assert zoned_time_ms(text, "since") == 1_795_334_400_000


@pytest.mark.parametrize(
    "text", ["yesterday", "", "2026-11-22T08:00:00", "2026-11-22", "1795334400000"]
)
def test_a_time_without_a_zone_or_no_time_is_refused_naming_the_field(text: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        zoned_time_ms(text, "since")
    assert [error.field for error in caught.value.errors] == ["since"]
    assert "ISO 8601 time with a zone" in caught.value.errors[0].message
