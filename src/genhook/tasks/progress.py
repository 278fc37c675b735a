"""Engine progress and log lines, from the engine's thread to the ``task_events`` table.

An engine may call ``report`` as often as it likes; the recorder keeps only the latest
progress and the new log lines and writes them at most once per
``progress_interval_seconds``, in one transaction, and only while the task is still ours
(processing under this worker's lease), so a slow or abandoned engine never writes into a
task that moved on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
from collections.abc import AsyncIterator

from sqlalchemy import insert

from genhook.db import Database, TaskEvent, now_ms
from genhook.tasks.store.reads import running_owner

log = logging.getLogger(__name__)

# A log line is a short note, not a dump; longer lines are cut, and a task keeps this many.
MAX_LOG_CHARS = 500
MAX_LOG_LINES = 200


class ProgressRecorder:
    def __init__(self, db: Database, task_id: str, worker_id: str, interval: float) -> None:
        self.db = db
        self.task_id = task_id
        self.worker_id = worker_id
        self.interval = interval
        self._lock = threading.Lock()
        self._progress: float | None = None
        self._last_written: float | None = None
        self._lines: list[tuple[int, str]] = []
        self._line_count = 0
        self._dirty = threading.Event()
        # The background flusher starts at the first report, so a task whose engine
        # reports nothing costs no flusher task or timer.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._flusher: asyncio.Task[None] | None = None

    def report(self, progress: float | None = None, log: str | None = None) -> None:
        """Called from the engine's thread; never blocks on the database."""
        with self._lock:
            if progress is not None and math.isfinite(progress):
                self._progress = min(1.0, max(0.0, float(progress)))
            if log is not None and self._line_count < MAX_LOG_LINES:
                text = " ".join(str(log).split())[:MAX_LOG_CHARS]
                if text:
                    self._lines.append((now_ms(), text))
                    self._line_count += 1
        if not self._dirty.is_set():
            self._dirty.set()
            if self._loop is not None and self._flusher is None:
                with contextlib.suppress(RuntimeError):  # the loop closed: nothing to flush to
                    self._loop.call_soon_threadsafe(self._start_flusher)

    def _start_flusher(self) -> None:
        if self._flusher is None and self._stop is not None and not self._stop.is_set():
            self._flusher = asyncio.create_task(self.run(self._stop))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Flush in the background while the engine runs, and what is left when it ends
        (before the terminal transition, so the last lines come before the result)."""
        self._stop = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        if self._dirty.is_set():
            self._start_flusher()
        try:
            yield
        finally:
            self._stop.set()
            if self._flusher is not None:
                with contextlib.suppress(Exception):
                    await self._flusher
            else:
                await self._flush_logged()

    async def run(self, stop: asyncio.Event) -> None:
        """Flush what was reported, at most once per interval, until ``stop``; then once more."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)
            await self._flush_logged()
        await self._flush_logged()

    async def _flush_logged(self) -> None:
        try:
            await self.flush()
        except Exception:
            log.exception("task %s: writing progress failed", self.task_id)

    async def flush(self) -> None:
        if not self._dirty.is_set():
            return
        with self._lock:
            self._dirty.clear()
            lines, self._lines = self._lines, []
            progress = self._progress if self._progress != self._last_written else None
            self._last_written = self._progress
        if not lines and progress is None:
            return
        rows: list[dict[str, object]] = [
            {"task_id": self.task_id, "progress": None, "message": text, "created_at": at}
            for at, text in lines
        ]
        if progress is not None:
            if rows:
                rows[-1]["progress"] = progress
            else:
                rows.append(
                    {"task_id": self.task_id, "progress": progress, "message": None}
                    | {"created_at": now_ms()}
                )
        async with self.db.write() as session:
            owner = await running_owner(session, self.task_id)
            if owner != self.worker_id:
                return
            await session.execute(insert(TaskEvent), rows)
