"""How a SQLite transaction begins: a write takes the write lock at once (``BEGIN
IMMEDIATE``), a read does not, and a BEGIN that fails is SQLAlchemy's error, which the
fault handling retries. SQLite only: PostgreSQL begins its own way."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy import text

from genhook.db import sqlite as sqlite_db
from genhook.db.database import Database
from genhook.faults import is_infrastructure_error


def _other_writer(path: Path) -> sqlite3.Connection:
    """A connection of another process's kind, which gives up at once on a held lock."""
    return sqlite3.connect(path, timeout=0, isolation_level=None)


async def test_a_write_holds_the_lock_from_its_start_and_a_read_does_not(tmp_path: Path) -> None:
    path = tmp_path / "begin.db"
    db = Database(f"sqlite+aiosqlite:///{path}")
    other = _other_writer(path)
    try:
        async with db.write() as session:
            await session.execute(text("CREATE TABLE item (id INTEGER PRIMARY KEY)"))
        async with db.write() as session:
            await session.connection()  # no statement yet: the BEGIN alone holds the lock
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")
            await session.execute(text("INSERT INTO item (id) VALUES (1)"))
        async with db.read() as session:
            assert (await session.execute(text("SELECT count(*) FROM item"))).scalar() == 1
            other.execute("BEGIN IMMEDIATE")  # a read leaves the write lock free
            other.execute("ROLLBACK")
    finally:
        other.close()
        await db.dispose()


async def test_a_failed_begin_is_an_infrastructure_fault_and_the_pool_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "locked.db"

    def impatient(name: str) -> sqlite3.Connection:
        connection = sqlite3.connect(name, timeout=0, isolation_level=None)
        connection.execute("PRAGMA journal_mode=WAL")
        return connection

    monkeypatch.setattr(sqlite_db, "open_sqlite", impatient)
    db = Database(f"sqlite+aiosqlite:///{path}")
    other = _other_writer(path)
    try:
        async with db.write() as session:
            await session.execute(text("CREATE TABLE item (id INTEGER PRIMARY KEY)"))
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(sa_exc.OperationalError, match="locked") as raised:
            async with db.write() as session:
                await session.execute(text("INSERT INTO item (id) VALUES (1)"))
        assert is_infrastructure_error(raised.value)
        other.execute("ROLLBACK")
        async with db.write() as session:
            await session.execute(text("INSERT INTO item (id) VALUES (2)"))
        async with db.read() as session:
            rows = (await session.execute(text("SELECT id FROM item"))).scalars().all()
        assert rows == [2]
    finally:
        other.close()
        await db.dispose()
