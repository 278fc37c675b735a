"""SQLite's WAL checkpointer sleeps while its process is idle and is woken after a commit.

The idle fallback is set to an hour here, so a checkpoint that happens at all was started by
the commit. SQLite only: PostgreSQL has no checkpointer of ours.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from genhook.db import sqlite as sqlite_db
from genhook.db.database import Database


class _HourlyCheckpointer(sqlite_db.Checkpointer):
    def __init__(self, path: str, **options: Any) -> None:
        super().__init__(path, idle_interval=3600.0)


async def test_a_commit_wakes_the_checkpointer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "wal.db"
    # Held open throughout: the last connection to close would checkpoint by itself.
    keeper = sqlite3.connect(path, isolation_level=None)
    keeper.execute("PRAGMA journal_mode=WAL")
    keeper.execute("PRAGMA wal_autocheckpoint=0")
    keeper.execute("CREATE TABLE item (id INTEGER PRIMARY KEY, body BLOB)")
    keeper.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    monkeypatch.setattr(sqlite_db, "Checkpointer", _HourlyCheckpointer)
    before = path.stat()
    db = Database(f"sqlite+aiosqlite:///{path}")
    try:
        async with db.write() as session:
            body = b"x" * 200_000
            await session.execute(text("INSERT INTO item (body) VALUES (:body)"), {"body": body})
        # The rows reach the database file only by a checkpoint.
        deadline = time.monotonic() + 60
        while path.stat().st_size == before.st_size:
            assert time.monotonic() < deadline, "no checkpoint after the commit"
            await asyncio.sleep(0.05)
        assert keeper.execute("SELECT count(*) FROM item").fetchone() == (1,)
    finally:
        await db.dispose()
        keeper.close()


async def test_the_commit_leaves_the_thread_asleep_until_one_interval_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Woken at the commit, the thread would compete with it for the GIL."""
    monkeypatch.setattr(sqlite_db, "Checkpointer", _HourlyCheckpointer)
    db = Database(f"sqlite+aiosqlite:///{tmp_path / 'quiet.db'}")
    checkpointer = db._checkpointer
    assert checkpointer is not None
    woken: list[float] = []
    wake = checkpointer.wake
    monkeypatch.setattr(checkpointer, "wake", lambda: (woken.append(time.monotonic()), wake()))
    try:
        async with db.write() as session:
            await session.execute(text("CREATE TABLE item (id INTEGER PRIMARY KEY)"))
        committed = time.monotonic()
        assert woken == []
        for _ in range(5):  # more commits within the interval schedule nothing more
            async with db.write() as session:
                await session.execute(text("INSERT INTO item DEFAULT VALUES"))
        deadline = time.monotonic() + 30
        while not woken:
            assert time.monotonic() < deadline, "the thread was never woken"
            await asyncio.sleep(0.02)
        assert woken[0] - committed >= checkpointer.interval * 0.9
        await asyncio.sleep(checkpointer.interval * 2)
        assert len(woken) == 1
    finally:
        await db.dispose()


def test_a_commit_outside_an_event_loop_wakes_the_thread_at_once(tmp_path: Path) -> None:
    checkpointer = sqlite_db.Checkpointer(str(tmp_path / "thread.db"), idle_interval=3600.0)
    checkpointer.committed()
    assert checkpointer._written.is_set()
