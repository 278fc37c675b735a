"""The database handle: one async engine per process, SQLite (WAL) or PostgreSQL.

On SQLite, write transactions start with ``BEGIN IMMEDIATE`` so two processes never both
hold a read snapshot and then fail to upgrade it to a write lock; reads stay deferred.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)


def now_ms() -> int:
    return int(time.time() * 1000)


class Database:
    def __init__(self, url: str, *, pool_size: int = 10) -> None:
        self.url = url
        parsed = make_url(url)
        self.dialect = parsed.get_backend_name()
        self.is_sqlite = self.dialect == "sqlite"
        self.is_postgres = self.dialect == "postgresql"
        if self.is_sqlite:
            database = parsed.database or ""
            if database and database != ":memory:":
                Path(database).parent.mkdir(parents=True, exist_ok=True)
            self.write_engine = self._sqlite_engine(url, immediate=True)
            self.read_engine = self._sqlite_engine(url, immediate=False)
        else:
            self.write_engine = create_async_engine(
                url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True
            )
            self.read_engine = self.write_engine
        # SQLite allows one writer at a time; queueing this process's writers here costs
        # nothing, while letting them collide makes SQLite's busy handler sleep for
        # milliseconds. Other processes still wait through busy_timeout.
        self._write_lock: asyncio.Lock | None = asyncio.Lock() if self.is_sqlite else None
        self._write_sessions = async_sessionmaker(self.write_engine, expire_on_commit=False)
        self._read_sessions = async_sessionmaker(self.read_engine, expire_on_commit=False)

    @staticmethod
    def _sqlite_engine(url: str, *, immediate: bool) -> AsyncEngine:
        engine = create_async_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine.sync_engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        @event.listens_for(engine.sync_engine, "begin")
        def _on_begin(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        return engine

    @asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncSession]:
        """A session in one write transaction, committed on success, rolled back on error."""
        if self._write_lock is None:
            async with self._write_sessions() as session, session.begin():
                yield session
            return
        async with self._write_lock, self._write_sessions() as session, session.begin():
            yield session

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncSession]:
        async with self._read_sessions() as session, session.begin():
            yield session

    async def dispose(self) -> None:
        await self.write_engine.dispose()
        if self.read_engine is not self.write_engine:
            await self.read_engine.dispose()
