"""Deduplication of deliveries by ``session_id`` (delivery is at-least-once, so duplicates happen).

A receiver asks ``first_time(session_id)`` after verifying: True means process it, False
means it was seen before, so answer 200 and do nothing. If processing then fails, ``forget``
lets the next retry through again.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Protocol, runtime_checkable


@runtime_checkable
class DedupStore(Protocol):
    def first_time(self, session_id: str) -> bool:
        """Record ``session_id``; True only for the first caller, atomically."""

    def forget(self, session_id: str) -> None:
        """Drop ``session_id`` so its next delivery counts as new."""


class MemoryDedupStore:
    """In-process store for a single-process receiver; keeps the newest ``max_entries``."""

    def __init__(self, max_entries: int = 100_000) -> None:
        self.max_entries = max_entries
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def first_time(self, session_id: str) -> bool:
        with self._lock:
            if session_id in self._seen:
                return False
            self._seen[session_id] = None
            while len(self._seen) > self.max_entries:
                self._seen.popitem(last=False)
            return True

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._seen.pop(session_id, None)


class SQLiteDedupStore:
    """Durable store shared by every process and thread of a receiver on one machine.

    Atomic through SQLite's own locking (``INSERT OR IGNORE`` on a primary key), so two
    workers racing on the same delivery cannot both win. ``prune`` drops old entries; the
    service stops retrying within hours, so a week is plenty.
    """

    def __init__(self, path: str | Path, *, busy_timeout: float = 5.0) -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
        )
        if self.path != ":memory:":
            # WAL lets readers and the writer overlap; NORMAL sync survives a process crash,
            # and a power cut can at worst forget a few ids, which the dedup of a retried
            # delivery tolerates (the task is then processed twice, never lost).
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS genhook_webhook_seen ("
            "session_id TEXT PRIMARY KEY, first_seen_ms INTEGER NOT NULL)"
        )

    def first_time(self, session_id: str) -> bool:
        with self._lock:
            cursor = self._db.execute(
                "INSERT OR IGNORE INTO genhook_webhook_seen (session_id, first_seen_ms) "
                "VALUES (?, ?)",
                (session_id, int(time.time() * 1000)),
            )
            return cursor.rowcount == 1

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM genhook_webhook_seen WHERE session_id = ?", (session_id,))

    def prune(self, older_than_seconds: float = 7 * 86400) -> int:
        """Delete entries first seen more than ``older_than_seconds`` ago; return how many."""
        cutoff = int((time.time() - older_than_seconds) * 1000)
        with self._lock:
            cursor = self._db.execute(
                "DELETE FROM genhook_webhook_seen WHERE first_seen_ms < ?", (cutoff,)
            )
            return cursor.rowcount

    def close(self) -> None:
        with self._lock:
            self._db.close()
