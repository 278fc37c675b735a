"""SQLite transactions that write large values, run in a thread on a connection of their own.

SQLite statements run inline on the event loop (``genhook.db.database``): right for the
microsecond statements of ordinary work, wrong for a submit carrying a 30 MB input image,
whose insert copies the value into SQLite and whose commit writes tens of megabytes of
pages to the WAL, for hundreds of milliseconds in which the loop would answer nothing.
``ThreadWriter`` runs such a transaction in a worker thread instead, holding the process's
write turn (``Database.write_turn``) as the delivery queue does, and writes each large value
through SQLite's incremental blob I/O in 256 KiB pieces: SQLite releases the interpreter
lock while it works, so no single call holds it for long.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event, func, insert, literal_column
from sqlalchemy import select as sql_select
from sqlalchemy.pool import StaticPool

from genhook.db.database import Database, open_sqlite
from genhook.db.models import Blob, IdempotencyKey, Task

T = TypeVar("T")
# A value larger than this makes a transaction worth the hand-over to the thread.
LARGE_VALUE_BYTES = 1024 * 1024
PIECE_BYTES = 256 * 1024


class ThreadWriter:
    """One thread and one connection, made on first use; both go when the writer does."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._engine: Engine | None = None
        self._thread: ThreadPoolExecutor | None = None

    def wanted(self, blobs: list[dict[str, Any]]) -> bool:
        """Whether writing ``blobs`` (rows of ``blobs``) should leave the event loop."""
        path = self.db.sqlite_path
        return (
            bool(path)
            and path != ":memory:"
            and any(len(blob["data"]) > LARGE_VALUE_BYTES for blob in blobs)
        )

    async def run(self, work: Callable[[Connection], T]) -> T:
        """``work`` in one ``BEGIN IMMEDIATE`` transaction on the thread's connection."""
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-large")
        loop = asyncio.get_running_loop()
        async with self.db.write_turn():
            future = loop.run_in_executor(self._thread, partial(self._run, work))
            try:
                return await asyncio.shield(future)
            except asyncio.CancelledError:
                # Keep the write turn until the transaction has ended either way.
                await asyncio.wait({future})
                raise

    def _run(self, work: Callable[[Connection], T]) -> T:
        if self._engine is None:
            self._engine = _engine(self.db.sqlite_path or "")
        with self._engine.begin() as connection:
            return work(connection)


def _engine(path: str) -> Engine:
    engine = create_engine("sqlite://", creator=partial(open_sqlite, path), poolclass=StaticPool)

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def insert_blobs(connection: Connection, blobs: list[dict[str, Any]]) -> None:
    """Insert rows of ``blobs``; a large value is written in pieces, never bound whole."""
    small = [blob for blob in blobs if len(blob["data"]) <= LARGE_VALUE_BYTES]
    if small:
        connection.execute(insert(Blob), small)
    for blob in blobs:
        data = blob["data"]
        if len(data) <= LARGE_VALUE_BYTES:
            continue
        connection.execute(insert(Blob).values({**blob, "data": func.zeroblob(len(data))}))
        rowid: int = connection.execute(
            sql_select(literal_column("rowid")).select_from(Blob).where(Blob.key == blob["key"])
        ).scalar_one()
        raw = connection.connection.driver_connection
        assert raw is not None
        view = memoryview(data)
        with raw.blobopen("blobs", "data", rowid) as handle:
            for offset in range(0, len(data), PIECE_BYTES):
                handle.write(view[offset : offset + PIECE_BYTES])


def write_task_rows(
    connection: Connection,
    task: dict[str, Any],
    blobs: list[dict[str, Any]],
    keys: list[dict[str, Any]],
) -> None:
    """A submit's rows: its task, its input blobs and its idempotency key."""
    connection.execute(insert(Task), [task])
    insert_blobs(connection, blobs)
    if keys:
        connection.execute(insert(IdempotencyKey), keys)
