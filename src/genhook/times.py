"""Times as the API writes them: epoch milliseconds as ISO 8601 in UTC, to the millisecond.

Neutral: the task domain, the webhook side, the API and the CLI all format times here.
"""

from __future__ import annotations

from datetime import UTC, datetime


def iso_ms(epoch_ms: int) -> str:
    moment = datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
