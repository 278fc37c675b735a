"""The database handle: one async engine per process, SQLite (WAL) or PostgreSQL.

On SQLite, write transactions start with ``BEGIN IMMEDIATE`` so two processes never both
hold a read snapshot and then fail to upgrade it to a write lock; reads stay deferred.

What is SQLite's own (inline connections, the writers' turn between processes, the
checkpointer thread) is in ``genhook.db.sqlite``; this class chooses and combines them.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from genhook.db import sqlite, wakeups
from genhook.db.driver import PostgresTx, SessionTx, SQLiteTx, Tx
from genhook.files import private_sqlite


def now_ms() -> int:
    return int(time.time() * 1000)


# A pooled PostgreSQL connection idle for longer than this is pinged before it is used.
PING_AFTER_IDLE_SECONDS = 1.0


def ping_when_idle(engine: AsyncEngine, idle_seconds: float) -> None:
    """Check a pooled connection with a round trip only when it has sat idle.

    SQLAlchemy's ``pool_pre_ping`` pings at every checkout, and the asyncpg dialect's ping
    is three round trips (``BEGIN``, ``;``, ``ROLLBACK``): about 250 us of CPU and 400 us of
    waiting added to every transaction, most of a short one's cost. A connection that
    answered within the last second is used as it is. If the server went away meanwhile,
    the transaction fails with a disconnect, which SQLAlchemy answers by discarding every
    connection of the pool, and the caller's fault handling (a retry, or 503 to a client)
    treats it as a database restart, as it does a transaction cut off mid-way. A failed
    ping makes the pool open a new connection in its place, as ``pool_pre_ping`` does.
    """
    pool_events = engine.sync_engine  # the engine's pool, and whichever replaces it
    _dropped.setdefault(pool_events, float("-inf"))

    @event.listens_for(pool_events, "connect")
    def _connected(dbapi_connection: Any, record: Any) -> None:
        record.info["used"] = time.monotonic()

    @event.listens_for(pool_events, "checkin")
    def _returned(dbapi_connection: Any, record: Any) -> None:
        if dbapi_connection is not None:
            record.info["used"] = time.monotonic()

    @event.listens_for(pool_events, "checkout")
    def _checked_out(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        used = record.info.get("used")
        recent = used is not None and time.monotonic() - used < idle_seconds
        if recent and used > _dropped[pool_events]:
            return
        try:
            dbapi_connection.ping()
        except Exception as error:
            raise DisconnectionError(f"the database did not answer a ping: {error}") from error


# Per engine: when a connection of its pool was last found dropped by the server.
_dropped: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()


def connections_dropped(engine: AsyncEngine) -> None:
    """A transaction outside SQLAlchemy found its connection dropped: ping every pooled
    connection used before now at its next checkout, as SQLAlchemy's own disconnect
    handling would have discarded them, rather than let each fail one transaction."""
    if engine.sync_engine in _dropped:
        _dropped[engine.sync_engine] = time.monotonic()


def queue_connect_args(timeout: float | None, *, claims: bool) -> dict[str, Any]:
    """asyncpg's connection arguments.

    A claim takes the first free row of a queue in order (``ORDER BY available_at LIMIT n FOR
    UPDATE SKIP LOCKED``), which an index walked in order answers after a row or two. When
    the planner's statistics predate a burst of new rows (a new database, or a backlog that
    grew faster than autovacuum analyzes), it estimates a handful of queued rows and picks a
    bitmap scan of every one of them and a sort: each claim then reads the whole backlog
    (2-5 ms a claim at 6,000 queued, against 0.05 ms). Without bitmap scans the in-order
    index scan is chosen whatever the statistics say. The claiming roles look rows up by key
    or walk an index in order otherwise, so nothing they run needs a bitmap scan; the API's
    listings, with filters of a client's choosing, keep them.
    """
    args: dict[str, Any] = {"timeout": timeout} if timeout else {}
    if claims:
        args["server_settings"] = {"enable_bitmapscan": "off"}
    return args


class Database:
    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 10,
        pool_timeout: float = 30.0,
        connect_timeout: float | None = None,
        claims: bool = False,
    ) -> None:
        """``claims``: this process claims from the queues (a worker, a dispatcher);
        on PostgreSQL its connections plan without bitmap scans (``queue_connect_args``)."""
        self.url = url
        parsed = make_url(url)
        self.dialect = parsed.get_backend_name()
        self.is_sqlite = self.dialect == "sqlite"
        self.is_postgres = self.dialect == "postgresql"
        # The database file, for SQLite work on a connection of its own.
        self.sqlite_path: str | None = None
        self._turn: sqlite.WriterTurn | None = None
        # The connection of this process's driver transactions on SQLite (``transaction``).
        self._driver: sqlite3.Connection | None = None
        if self.is_sqlite:
            database = parsed.database or ""
            self.sqlite_path = database
            private_sqlite(database)
            self.write_engine = sqlite.sqlite_engine(url, immediate=True)
            self.read_engine = sqlite.sqlite_engine(url, immediate=False)
            self._checkpointer: sqlite.Checkpointer | None = None
            if database and database != ":memory:":
                if not database.startswith("file:"):
                    self._turn = sqlite.WriterTurn(database)
                self._checkpointer = sqlite.Checkpointer(database)
                self._checkpointer.start()
                event.listen(self.write_engine.sync_engine, "commit", self._checkpointer.committed)
        else:
            self._checkpointer = None
            self.write_engine = create_async_engine(
                url,
                pool_size=pool_size,
                max_overflow=pool_size,
                pool_timeout=pool_timeout,
                # The most recently returned connection first: a process's hot
                # connections stay recent (no ping, below) and the rest may sit idle.
                pool_use_lifo=True,
                connect_args=queue_connect_args(connect_timeout, claims=claims),
            )
            ping_when_idle(self.write_engine, PING_AFTER_IDLE_SECONDS)
            self.read_engine = self.write_engine
        # SQLite allows one writer at a time; queueing this process's writers here costs
        # nothing, while letting them collide makes SQLite's busy handler sleep for
        # milliseconds. Other processes take turns with this one through ``WriterTurn``.
        self._write_lock: asyncio.Lock | None = asyncio.Lock() if self.is_sqlite else None
        self._write_sessions = async_sessionmaker(self.write_engine, expire_on_commit=False)
        self._read_sessions = async_sessionmaker(self.read_engine, expire_on_commit=False)

    @asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncSession]:
        """A session in one write transaction, committed on success, rolled back on error."""
        if self._write_lock is None:
            async with self._write_sessions() as session, session.begin():
                yield session
            return
        async with (
            self._write_lock,
            self._between_processes(),
            self._write_sessions() as session,
            session.begin(),
        ):
            yield session

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        """A write transaction on the driver connection (``genhook.db.driver``), committed
        on success, rolled back on error; wake-ups it announced go out after the commit.

        An in-memory SQLite database, which another connection would not see, gets a
        session's transaction behind the same port."""
        if self.is_postgres:
            async with self.postgres_transaction() as pg_tx:
                yield pg_tx
            return
        if self._turn is None:
            async with self.write() as session:
                yield SessionTx(session)
            return
        async with self._write_lock or contextlib.nullcontext(), self._between_processes():
            if self._driver is None:
                self._driver = sqlite.open_sqlite(self.sqlite_path or "")
            tx = SQLiteTx(self._driver, self.write_engine.dialect)
            tx.begin()
            try:
                yield tx
                tx.commit()
            except BaseException:
                tx.rollback()
                raise
        if self._checkpointer is not None:
            self._checkpointer.committed()
        if tx.channels:
            wakeups.committed(self.write_engine.sync_engine, tx.channels)

    @asynccontextmanager
    async def postgres_transaction(self, *, atomic: bool = True) -> AsyncIterator[PostgresTx]:
        """``transaction`` on PostgreSQL; its ``connection`` also serves hand-written SQL.

        ``atomic=False`` sends no BEGIN and no COMMIT: each statement commits on its own.
        For work that is one statement, that is one round trip instead of three."""
        async with self.write_engine.connect() as connection:
            raw = await connection.get_raw_connection()
            pg: Any = raw.driver_connection
            if pg.is_closed():
                # Dropped by the server while it sat in the pool (a restart) and used too
                # recently to be pinged: nothing was sent on it yet, so take another.
                connections_dropped(self.write_engine)
                await connection.invalidate()
                raw = await connection.get_raw_connection()
                pg = raw.driver_connection
            tx = PostgresTx(pg, self.write_engine.dialect, autocommit=not atomic)
            try:
                if not atomic:
                    yield tx
                else:
                    await tx.begin()
                    try:
                        yield tx
                    except BaseException:
                        await tx.rollback()
                        raise
                    await tx.commit()
            except BaseException as error:
                # A connection the server dropped, or one a cancellation left inside its
                # transaction, would go back to the pool as such: the pool knows nothing of
                # what happened on the driver connection.
                closed = pg.is_closed()
                if closed:
                    # The server went away: its other pooled connections are suspect too.
                    connections_dropped(self.write_engine)
                if closed or pg.is_in_transaction():
                    await connection.invalidate()
                if closed and isinstance(error, Exception):
                    tx.reraise(error)  # a disconnect, also from a call made on tx.connection
                raise
        if tx.channels:
            wakeups.committed(self.write_engine.sync_engine, tx.channels)

    @asynccontextmanager
    async def write_turn(self) -> AsyncIterator[None]:
        """This process's turn to write on SQLite, for a transaction on another connection
        (in another thread): writers on the loop wait here instead of inside SQLite."""
        if self._write_lock is None:
            yield
            return
        async with self._write_lock, self._between_processes():
            yield

    def _between_processes(self) -> contextlib.AbstractAsyncContextManager[None]:
        return contextlib.nullcontext() if self._turn is None else self._turn.held()

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncSession]:
        async with self._read_sessions() as session, session.begin():
            yield session

    async def check_writable(self) -> None:
        """Raise unless this database takes writes now (readiness: a standby or a locked or
        read-only SQLite file is not ready)."""
        if self.is_postgres:
            async with self.read() as session:
                if (await session.execute(text("SELECT pg_is_in_recovery()"))).scalar_one():
                    raise RuntimeError("the server is a read-only standby")
            return
        # SQLite: taking the write lock (BEGIN IMMEDIATE) proves the file can be written to.
        async with self.write() as session:
            await session.execute(text("SELECT 1"))

    async def dispose(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.stop()
        if self._turn is not None:
            self._turn.close()
        if self._driver is not None:
            self._driver.close()
            self._driver = None
        await self.write_engine.dispose()
        if self.read_engine is not self.write_engine:
            await self.read_engine.dispose()
