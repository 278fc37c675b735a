"""Waiting on tasks: the live fields of a result (queue position, progress, logs), and a
per-process watcher that wakes everyone waiting on a task when it changes.

Workers run in other processes (often on other machines), so changes are found by polling
the database; one poll per ``watch_poll_seconds`` serves every waiter of the process, in a
single query, and runs only while someone waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from genhook.config import Settings
from genhook.db import Database, Task, TaskEvent
from genhook.statuses import TaskStatus
from genhook.storage import BlobStore
from genhook.task_states import polled_status
from genhook.tasks.store import reads
from genhook.tasks.views import iso_ms, prediction_view

log = logging.getLogger(__name__)

# What a waiter has seen of a task: its stored status and its last event id (0: none).
Signature = tuple[str, int]


async def last_event_id(session: AsyncSession, task_id: str) -> int:
    value = await session.scalar(select(func.max(TaskEvent.id)).where(TaskEvent.task_id == task_id))
    return int(value or 0)


async def log_lines(
    session: AsyncSession, task_id: str, after: int = 0, upto: int | None = None
) -> list[dict[str, str]]:
    """The task's log lines recorded after event ``after`` (and up to event ``upto``)."""
    query = select(TaskEvent.created_at, TaskEvent.message).where(
        TaskEvent.task_id == task_id, TaskEvent.id > after, TaskEvent.message.is_not(None)
    )
    if upto is not None:
        query = query.where(TaskEvent.id <= upto)
    rows = await session.execute(query.order_by(TaskEvent.id))
    return [{"at": iso_ms(at), "message": str(message)} for at, message in rows]


async def live_fields(session: AsyncSession, task: Task, fair: bool = True) -> dict[str, Any]:
    """Fields a waiting or running task adds to its result; none once it has ended.
    ``fair``: the queue position counts in fair order (``GENHOOK_SCHEDULING``)."""
    if task.status == TaskStatus.CREATED:
        return {"queue_position": await reads.queue_position(session, task, fair)}
    if task.status != TaskStatus.PROCESSING:
        return {}
    fields: dict[str, Any] = {}
    if task.started_at is not None:
        fields["started_at"] = iso_ms(task.started_at)
    progress = await session.scalar(
        select(TaskEvent.progress)
        .where(TaskEvent.task_id == task.id, TaskEvent.progress.is_not(None))
        .order_by(TaskEvent.id.desc())
        .limit(1)
    )
    if progress is not None:
        fields["progress"] = round(float(progress), 4)
    return fields


async def task_view(
    session: AsyncSession,
    task: Task,
    settings: Settings,
    storage: BlobStore,
    *,
    logs: bool = False,
) -> dict[str, Any]:
    """The result as polling shows it, with the live fields and, on request, the logs."""
    view = await prediction_view(task, settings, storage)
    view.update(await live_fields(session, task, settings.scheduling == "fair"))
    if logs:
        view["logs"] = await log_lines(session, task.id)
    return view


async def current_signature(db: Database, task: Task) -> Signature:
    async with db.read() as session:
        return task.status, await last_event_id(session, task.id)


async def read_task_view(
    db: Database, task: Task, settings: Settings, storage: BlobStore, *, logs: bool = False
) -> dict[str, Any]:
    async with db.read() as session:
        return await task_view(session, task, settings, storage, logs=logs)


async def stream_step(
    db: Database,
    task_id: str,
    sent: tuple[str, int] | None,
    settings: Settings,
    storage: BlobStore,
) -> tuple[Task, int, list[tuple[int, dict[str, Any]]]] | None:
    """One look at a streamed task, in one read: the task, its last event id, and the events
    to send after ``sent`` as (event id, view), none when nothing changed; None once the task
    is gone.

    Every recorded progress report of a running task since ``sent`` is an event of its own,
    with the log lines recorded up to it, however many were recorded between two looks
    (the recorder already keeps at most one per ``progress_interval_seconds``); the last
    event is the task as it is now, with the log lines after those."""
    async with db.read() as session:
        task = await reads.task_in(session, task_id)
        if task is None:
            return None
        newest = await last_event_id(session, task_id)
        if (polled_status(task.status), newest) == sent:
            return task, newest, []
        view = await task_view(session, task, settings, storage)
        after = sent[1] if sent else 0
        events: list[tuple[int, dict[str, Any]]] = []
        if sent is not None and task.status == TaskStatus.PROCESSING:
            steps = (
                await session.execute(
                    select(TaskEvent.id, TaskEvent.progress)
                    .where(
                        TaskEvent.task_id == task_id,
                        TaskEvent.id > after,
                        TaskEvent.id <= newest,
                        TaskEvent.progress.is_not(None),
                    )
                    .order_by(TaskEvent.id)
                )
            ).all()
            # The newest report is the current view's own progress.
            for step_id, progress in steps[:-1]:
                step = {key: value for key, value in view.items() if key != "logs"}
                step["progress"] = round(float(progress or 0.0), 4)  # never None: filtered
                lines = await log_lines(session, task_id, after=after, upto=step_id)
                if lines:
                    step["logs"] = lines
                events.append((step_id, step))
                after = step_id
        # Up to ``newest`` only: a line recorded since that read (each statement of a read
        # sees new commits on PostgreSQL) belongs to a later event, not again to the next.
        lines = await log_lines(session, task_id, after=after, upto=newest)
        if lines:
            view["logs"] = lines
        events.append((newest, view))
        return task, newest, events


class TaskWatcher:
    def __init__(self, db: Database, interval: float) -> None:
        self.db = db
        self.interval = interval
        self._waiters: dict[str, list[tuple[Signature, asyncio.Future[Signature]]]] = {}
        self._poller: asyncio.Task[None] | None = None
        # Set at shutdown: every wait ends at once, so open streams and waiting requests
        # answer now instead of holding the shutdown for its whole grace period.
        self.closed = False

    def close(self) -> None:
        self.closed = True
        for waiters in self._waiters.values():
            for seen, future in waiters:
                if not future.done():
                    future.set_result(seen)

    async def wait_change(self, task_id: str, seen: Signature, timeout: float) -> Signature | None:
        """The task's new signature once it differs from ``seen``; None after ``timeout``
        or once the watcher is closed."""
        if self.closed:
            return None
        future: asyncio.Future[Signature] = asyncio.get_running_loop().create_future()
        entry = (seen, future)
        self._waiters.setdefault(task_id, []).append(entry)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll())
        try:
            changed = await asyncio.wait_for(asyncio.shield(future), max(0.0, timeout))
            return None if self.closed else changed
        except TimeoutError:
            return None
        finally:
            waiters = self._waiters.get(task_id)
            if waiters is not None:
                with contextlib.suppress(ValueError):
                    waiters.remove(entry)
                if not waiters:
                    del self._waiters[task_id]

    async def _poll(self) -> None:
        while self._waiters:
            await asyncio.sleep(self.interval)
            try:
                current = await self._signatures(list(self._waiters))
            except Exception:
                log.exception("watching tasks failed; retrying")
                continue
            for task_id, signature in current.items():
                for seen, future in self._waiters.get(task_id, []):
                    if signature != seen and not future.done():
                        future.set_result(signature)

    async def _signatures(self, task_ids: Sequence[str]) -> dict[str, Signature]:
        found: dict[str, Signature] = {}
        async with self.db.read() as session:
            for start in range(0, len(task_ids), 500):
                chunk = task_ids[start : start + 500]
                for task_id, status, event_id in await reads.signatures(session, chunk):
                    found[task_id] = (status, event_id)
        return found
