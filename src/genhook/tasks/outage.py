"""The sweeper's record of an outage of the service's own (a full disk, the database out),
kept in shared memory so that a restarted sweeper still knows when the outage began.

A sweeper that forgot it would start counting at its restart, and the tasks whose deadlines
fell between the outage's start and the restart would be timed out once it was over. The
record lives outside the data disk (``files.shared_memory_dir``), which may be the very thing
that is full, and is keyed by the database, whose tasks it concerns.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

from genhook.files import shared_memory_dir

# A record last confirmed longer ago than this is an outage that may have ended while no
# sweeper looked: it is forgiven up to its last confirmation, not up to now.
STALE_MS = 120_000


class OutageRecord:
    """When the current outage began (``since``), in this process and in shared memory."""

    def __init__(self, database_url: str) -> None:
        digest = hashlib.sha256(database_url.encode()).hexdigest()[:16]
        shared = shared_memory_dir()
        self.path: Path | None = None if shared is None else shared / f"outage-{digest}.json"
        self.since: int | None = None

    def _read(self) -> tuple[int, int] | None:
        if self.path is None:
            return None
        try:
            data = json.loads(self.path.read_text())
            return int(data["since"]), int(data["seen"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def goes_on(self, now: int) -> None:
        """The outage is still going on at ``now``: remember since when (a record a previous
        sweeper left recently continues), and confirm it in shared memory."""
        if self.since is None:
            found = self._read()
            self.since = found[0] if found and now - found[1] <= STALE_MS else now
        if self.path is not None:
            part = self.path.with_suffix(f".{os.getpid()}.tmp")
            with contextlib.suppress(OSError):
                part.write_text(json.dumps({"since": self.since, "seen": now}))
                os.replace(part, self.path)

    def over(self, now: int) -> tuple[int, int] | None:
        """The outage that has just ended, as (began, ended), or None when there was none."""
        if self.since is not None:
            return self.since, now
        found = self._read()
        if found is None:
            return None
        since, seen = found
        return since, now if now - seen <= STALE_MS else seen

    def clear(self) -> None:
        self.since = None
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
