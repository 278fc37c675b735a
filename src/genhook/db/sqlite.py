"""SQLite specifics, in one place: connections that run inline on the event loop, the turn
processes take to write, and the checkpointer thread.

SQLite statements run inline on the event loop (``InlineSQLiteConnection``, and under
SQLAlchemy's adapter ``_InlineAdapter``, which calls the sqlite3 connection directly). An
embedded SQLite statement takes microseconds, while aiosqlite's hop to a connection thread
and back costs far more under load (the thread waits for the GIL), which capped submits at a
few hundred per second. Inline calls are safe because write transactions inside one process
are serialized by ``Database._write_lock`` (so a process never waits on its own lock) and
every write transaction is short. Processes take turns through ``WriterTurn``, a lock on a
file beside the database that is waited for off the loop, so a writer never waits for another
process inside SQLite, where the busy handler would stall the event loop in growing sleeps.
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
from collections.abc import AsyncIterator, Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import aiosqlite
from sqlalchemy import event
from sqlalchemy.dialects.sqlite.aiosqlite import (
    AsyncAdapt_aiosqlite_connection,
    AsyncAdapt_aiosqlite_cursor,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.util.concurrency import await_

from genhook.files import FILE_MODE

log = logging.getLogger(__name__)


def open_sqlite(database: str) -> sqlite3.Connection:
    connection = sqlite3.connect(
        database, timeout=30, isolation_level=None, check_same_thread=False
    )
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=NORMAL")
    connection.execute("PRAGMA foreign_keys=ON")
    # Checkpoints run in ``Checkpointer``'s thread: inline, the checkpoint that a commit
    # triggers every ~4 MB of WAL would stall the event loop for its fsync.
    connection.execute("PRAGMA wal_autocheckpoint=0")
    return connection


class Checkpointer(threading.Thread):
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
                    log.warning("WAL checkpoint failed: %s", exc)
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


def sqlite_engine(url: str, *, immediate: bool) -> AsyncEngine:
    """An engine whose connections run inline; its transactions begin ``IMMEDIATE`` (the
    write engine) or deferred (the read engine)."""
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
