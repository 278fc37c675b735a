"""SQLite transactions that write large values, run in a thread on a connection of their own.

SQLite statements run inline on the event loop (``genhook.db.database``): right for the
microsecond statements of ordinary work, wrong for a submit carrying a 30 MB input image,
whose insert copies the value into SQLite and whose commit writes tens of megabytes of
pages to the WAL, for hundreds of milliseconds in which the loop would answer nothing.
``ThreadWriter`` runs such a transaction in a worker thread instead, holding the process's
write turn (``Database.write_turn``) as the delivery queue does, and writes each large value
through SQLite's incremental blob I/O in 256 KiB pieces: SQLite releases the interpreter
lock while it works, so no single call holds it for long. The statements are the task
store's (``genhook.tasks.store.writes.write_task_rows``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.pool import StaticPool

from genhook.db.database import Database
from genhook.db.sqlite import open_sqlite

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
