"""The database handle: one async engine per process, SQLite (WAL) or PostgreSQL.

On SQLite, write transactions start with ``BEGIN IMMEDIATE`` so two processes never both
hold a read snapshot and then fail to upgrade it to a write lock; reads stay deferred.

SQLite statements run inline on the event loop (``InlineSQLiteConnection``, and under
SQLAlchemy's adapter ``_InlineAdapter``, which calls the sqlite3 connection directly). An embedded
SQLite statement takes microseconds, while aiosqlite's hop to a connection thread and back
costs far more under load (the thread waits for the GIL), which capped submits at a few
hundred per second. Inline calls are safe because write transactions inside one process are
serialized by ``_write_lock`` (so a process never waits on its own lock) and every write
transaction is short. Processes take turns through ``WriterTurn``, a lock on a file beside
the database that is waited for off the loop, so a writer never waits for another process
inside SQLite, where the busy handler would stall the event loop in growing sleeps.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import aiosqlite
from sqlalchemy import event, text
from sqlalchemy.dialects.sqlite.aiosqlite import (
    AsyncAdapt_aiosqlite_connection,
    AsyncAdapt_aiosqlite_cursor,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.util.concurrency import await_

from genhook.db.driver import PostgresTx, SessionTx, SQLiteTx, Tx
from genhook.files import FILE_MODE, private_sqlite
from genhook.runtime import wakeups


def now_ms() -> int:
    return int(time.time() * 1000)


def open_sqlite(database: str) -> sqlite3.Connection:
    connection = sqlite3.connect(
        database, timeout=30, isolation_level=None, check_same_thread=False
    )
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=NORMAL")
    connection.execute("PRAGMA foreign_keys=ON")
    # Checkpoints run in ``_Checkpointer``'s thread: inline, the checkpoint that a commit
    # triggers every ~4 MB of WAL would stall the event loop for its fsync.
    connection.execute("PRAGMA wal_autocheckpoint=0")
    return connection


class _Checkpointer(threading.Thread):
    """Copies the WAL back into the database file, off the loop.

    PASSIVE checkpoints never block readers or writers; sqlite3 releases the GIL while
    they do I/O. A commit in this process wakes the thread one ``interval`` later, from the
    loop (``committed``): woken at the commit, the thread would take turns on the GIL with
    the commit and with whatever the loop does next, which measured about 0.4 ms per commit.
    While the WAL keeps changing the thread checkpoints every ``interval`` seconds on its
    own, and once it stops changing the thread sleeps until the next commit, looking only
    every ``idle_interval`` seconds (one ``stat``) for writes made outside the engine, so an
    idle process neither wakes nor touches the database here.
    """

    def __init__(self, database: str, interval: float = 0.2, idle_interval: float = 5.0) -> None:
        super().__init__(name="sqlite-checkpoint", daemon=True)
        self.database = database
        self.interval = interval
        self.idle_interval = idle_interval
        self.stopped = threading.Event()
        self._written = threading.Event()
        # Plain flags, read and written under the GIL: a lost update costs at most one
        # ``idle_interval`` of delay, never a checkpoint.
        self._scheduled = False
        self._busy = False

    def wake(self) -> None:
        """Look at the WAL now."""
        self._scheduled = False
        if not self._written.is_set():
            self._written.set()

    def committed(self, *_: Any) -> None:
        """A write is committing (a SQLAlchemy event listener): wake the thread later."""
        if self._scheduled or self._busy:
            return  # a look is due anyway
        self._scheduled = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a write from a thread of its own
            self.wake()
            return
        loop.call_later(self.interval, self.wake)

    def stop(self) -> None:
        self.stopped.set()
        self._written.set()

    def run(self) -> None:
        connection: sqlite3.Connection | None = None
        wal = self.database + "-wal"
        seen: tuple[int, int] | None = None
        busy = False
        try:
            while not self.stopped.is_set():
                if busy:
                    self.stopped.wait(self.interval)
                else:
                    self._written.wait(self.idle_interval)
                    self._written.clear()
                if self.stopped.is_set():
                    break
                try:
                    stat = os.stat(wal)
                except OSError:
                    busy = self._busy = False
                    continue
                busy = self._busy = (stat.st_size, stat.st_mtime_ns) != seen
                if not busy:
                    continue
                seen = (stat.st_size, stat.st_mtime_ns)
                try:
                    if connection is None:
                        connection = sqlite3.connect(
                            self.database, timeout=30, isolation_level=None
                        )
                    connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as exc:
                    logging.getLogger(__name__).warning("WAL checkpoint failed: %s", exc)
        finally:
            if connection is not None:
                connection.close()


class WriterTurn:
    """The processes of one SQLite file take turns to write through ``flock`` on
    ``<database>-writer``.

    Uncontended, the turn is one non-blocking system call on the loop. Contended, it is
    waited for in a thread of its own, which the kernel wakes the moment the holder lets go,
    while the loop goes on serving; SQLite's own busy handler instead polls in sleeps of
    up to 100 ms on the thread that asked. Writers outside the service (a CLI command,
    a migration) still meet SQLite's lock, through ``busy_timeout``.
    """

    def __init__(self, database: str) -> None:
        path = database + "-writer"
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        self._waiter: ThreadPoolExecutor | None = None

    async def acquire(self) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        if self._waiter is None:
            self._waiter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-turn")
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._waiter, fcntl.flock, self._fd, fcntl.LOCK_EX)
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            # The thread may still get the lock after this caller has gone: give it back.
            future.add_done_callback(self._release_late)
            raise

    def _release_late(self, future: asyncio.Future[None]) -> None:
        if not future.cancelled() and future.exception() is None:
            self.release()

    def release(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    @asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        await self.acquire()
        try:
            yield
        finally:
            self.release()

    def close(self) -> None:
        if self._waiter is not None:
            self._waiter.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(OSError):
            os.close(self._fd)


class _RunNow:
    """Stands in for aiosqlite's request queue: runs each request at once and settles its
    future, so ``await`` on it completes without a thread hop."""

    def put_nowait(self, item: tuple[asyncio.Future[Any] | None, Callable[[], Any]]) -> None:
        future, function = item
        try:
            result = function()
        except BaseException as exc:
            if future is None:
                raise
            future.set_exception(exc)
        else:
            if future is not None:
                future.set_result(result)


class InlineSQLiteConnection(aiosqlite.Connection):
    """An aiosqlite connection without its thread (aiosqlite 0.22's queue interface)."""

    def __init__(self, connector: Callable[[], sqlite3.Connection]) -> None:
        super().__init__(connector, iter_chunk_size=64)
        self._tx = _RunNow()  # type: ignore[assignment]

    def __await__(self) -> Generator[Any, None, aiosqlite.Connection]:
        return self._connect().__await__()


async def _nothing() -> None:
    pass


class _InlineCursor(AsyncAdapt_aiosqlite_cursor):
    """A cursor of the sqlite3 connection itself, its rows buffered as SQLAlchemy's asyncio
    layer expects."""

    __slots__ = ()
    _awaitable_cursor_close = False

    def _make_new_cursor(self, connection: Any) -> Any:
        return connection._conn.cursor()

    def _aenter_cursor(self, cursor: Any) -> Any:
        return cursor

    def execute(self, operation: Any, parameters: Any = None) -> Any:
        # SQLAlchemy's asyncio layer insists on an await in each statement.
        await_(_nothing())
        cursor: Any = self._cursor
        try:
            if parameters is None:
                result = cursor.execute(operation)
            else:
                result = cursor.execute(operation, parameters)
            if cursor.description:
                self._rows = collections.deque(cursor.fetchall())
            return result
        except Exception as error:
            self._adapt_connection._handle_exception(error)

    def executemany(self, operation: Any, seq_of_parameters: Any) -> Any:
        await_(_nothing())
        try:
            return self._cursor.executemany(operation, seq_of_parameters)
        except Exception as error:
            self._adapt_connection._handle_exception(error)


class _InlineAdapter(AsyncAdapt_aiosqlite_connection):
    """SQLAlchemy's aiosqlite adapter with statements, commits and rollbacks straight on
    the sqlite3 connection: they run inline anyway (``InlineSQLiteConnection``), and going
    through aiosqlite's awaitables cost a greenlet switch and a future per call, several
    per statement (about 40% of a short transaction's CPU)."""

    __slots__ = ()
    _cursor_cls = _InlineCursor

    def commit(self) -> None:
        try:
            self._connection._conn.commit()
        except Exception as error:
            self._handle_exception(error)

    def rollback(self) -> None:
        connection = self._connection._connection
        if connection is not None:
            try:
                connection.rollback()
            except Exception as error:
                self._handle_exception(error)


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
        self._turn: WriterTurn | None = None
        # The connection of this process's driver transactions on SQLite (``transaction``).
        self._driver: sqlite3.Connection | None = None
        if self.is_sqlite:
            database = parsed.database or ""
            self.sqlite_path = database
            private_sqlite(database)
            self.write_engine = self._sqlite_engine(url, immediate=True)
            self.read_engine = self._sqlite_engine(url, immediate=False)
            self._checkpointer: _Checkpointer | None = None
            if database and database != ":memory:":
                if not database.startswith("file:"):
                    self._turn = WriterTurn(database)
                self._checkpointer = _Checkpointer(database)
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

    @staticmethod
    def _sqlite_engine(url: str, *, immediate: bool) -> AsyncEngine:
        database = make_url(url).database or ":memory:"

        def connect() -> _InlineAdapter:
            connection: Any = await_(InlineSQLiteConnection(partial(open_sqlite, database)))
            return _InlineAdapter(engine.sync_engine.dialect.dbapi, connection)

        engine = create_async_engine(url, creator=connect)

        statement = "BEGIN IMMEDIATE" if immediate else "BEGIN"

        @event.listens_for(engine.sync_engine, "begin")
        def _on_begin(conn: Any) -> None:
            # Straight on the sqlite3 connection, which runs inline: through
            # ``exec_driver_sql`` the BEGIN cost about 50 us of CPU, most of an empty
            # transaction's statements. Errors are raised as SQLAlchemy's, as before.
            raw: sqlite3.Connection = conn.connection.driver_connection._conn
            try:
                raw.execute(statement)
            except sqlite3.Error as exc:
                raise DBAPIError.instance(statement, (), exc, sqlite3.Error) from exc

        return engine

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
                self._driver = open_sqlite(self.sqlite_path or "")
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
