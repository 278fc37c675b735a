"""The task state machine and its durable transitions.

created -> processing -> completed | failed | timeout; processing -> created when a lease is
lost (up to ``max_lease_losses``). Every transition is one conditional UPDATE, so two
workers or two sweepers racing on one task cannot both win, and a terminal state is final.
The terminal transition writes the usage line and the webhook outbox row in the same
transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from genhook.config import Settings
from genhook.db import Blob, Database, Task, UsageLine, now_ms
from genhook.errors import ErrorCode
from genhook.storage import BlobStore
from genhook.tasks.views import TIMEOUT_MESSAGE, prediction_view
from genhook.webhooks.events import enqueue_processing
from genhook.webhooks.outbox import enqueue_delivery, event_type_for

log = logging.getLogger(__name__)

TERMINAL = ("completed", "failed", "timeout")
ACTIVE = ("created", "processing")


async def enqueue_callback(
    session: AsyncSession, task: Task, settings: Settings, storage: BlobStore, now: int
) -> None:
    """Write the outbox row of ``task``'s terminal callback, with the payload polling shows."""
    payload = await prediction_view(task, settings, storage, for_webhook=True)
    await enqueue_delivery(
        session, task=task, event_type=event_type_for(task.kind), payload=payload, now=now
    )


@dataclass
class Lifecycle:
    settings: Settings
    db: Database
    storage: BlobStore

    async def claim(self, worker_id: str, models: Sequence[str]) -> Task | None:
        """Take the oldest runnable task under a lease, or None."""
        now = now_ms()
        candidate = (
            select(Task.id)
            .where(
                Task.status == "created",
                Task.available_at <= now,
                Task.deadline_at > now,
                Task.model.in_(list(models)),
            )
            .order_by(Task.available_at)
            .limit(1)
            .with_for_update(skip_locked=True)
            .scalar_subquery()
        )
        stmt = (
            update(Task)
            .where(Task.id == candidate, Task.status == "created")
            .values(
                status="processing",
                lease_owner=worker_id,
                lease_expires_at=now + self._lease_ms,
                attempts=Task.attempts + 1,
                started_at=now,
                updated_at=now,
            )
            .returning(Task)
            .execution_options(synchronize_session=False)
        )
        async with self.db.write() as session:
            task = (await session.execute(stmt)).scalars().first()
            if task is not None and task.webhook_events:
                await enqueue_processing(session, task, now)  # opt-in progress event
            return task

    @property
    def _lease_ms(self) -> int:
        return int(self.settings.lease_seconds * 1000)

    async def heartbeat(self, task_id: str, worker_id: str) -> bool:
        """Extend the lease; False means it was lost (expired and taken, or ended)."""
        now = now_ms()
        async with self.db.write() as session:
            result = await session.execute(
                update(Task)
                .where(
                    Task.id == task_id,
                    Task.status == "processing",
                    Task.lease_owner == worker_id,
                )
                .values(lease_expires_at=now + self._lease_ms, updated_at=now)
                .execution_options(synchronize_session=False)
            )
        return bool(result.rowcount)  # type: ignore[attr-defined]

    async def release(self, task_id: str, worker_id: str) -> bool:
        """Give a task back without counting a lost lease (graceful shutdown)."""
        now = now_ms()
        async with self.db.write() as session:
            result = await session.execute(
                update(Task)
                .where(
                    Task.id == task_id, Task.status == "processing", Task.lease_owner == worker_id
                )
                .values(
                    status="created",
                    lease_owner=None,
                    lease_expires_at=None,
                    available_at=now,
                    updated_at=now,
                )
                .execution_options(synchronize_session=False)
            )
        return bool(result.rowcount)  # type: ignore[attr-defined]

    async def complete(
        self,
        task_id: str,
        worker_id: str,
        *,
        outputs: list[str],
        nsfw: list[bool],
        info: dict[str, Any],
    ) -> bool:
        return await self._finish(
            task_id,
            worker_id,
            dict(status="completed", outputs=outputs, has_nsfw_contents=nsfw, info=info),
        )

    async def fail(
        self,
        task_id: str,
        worker_id: str,
        code: ErrorCode,
        message: str,
        info: dict[str, Any] | None = None,
    ) -> bool:
        values: dict[str, Any] = dict(status="failed", error_code=int(code), error_message=message)
        if info:
            values["info"] = info
        return await self._finish(task_id, worker_id, values)

    async def time_out(self, task_id: str, worker_id: str | None = None) -> bool:
        values = dict(
            status="timeout", error_code=int(ErrorCode.TIMEOUT), error_message=TIMEOUT_MESSAGE
        )
        return await self._finish(task_id, worker_id, values)

    async def _finish(self, task_id: str, worker_id: str | None, values: dict[str, Any]) -> bool:
        """One terminal transition; False when the task is no longer ours to end."""
        now = now_ms()
        conditions = [Task.id == task_id]
        if worker_id is None:
            conditions.append(Task.status.in_(ACTIVE))
        else:
            conditions += [Task.status == "processing", Task.lease_owner == worker_id]
        stmt = (
            update(Task)
            .where(*conditions)
            .values(
                **values, lease_owner=None, lease_expires_at=None, finished_at=now, updated_at=now
            )
            .returning(Task)
            .execution_options(synchronize_session=False)
        )
        async with self.db.write() as session:
            task = (await session.execute(stmt)).scalars().first()
            if task is None:
                return False
            await self._on_terminal(session, task, now)
        return True

    async def _on_terminal(self, session: AsyncSession, task: Task, now: int) -> None:
        input_keys = [item["blob"] for item in task.inputs if "blob" in item]
        if input_keys:
            await session.execute(delete(Blob).where(Blob.key.in_(input_keys)))
        if task.status == "completed" and task.charge:
            session.add(
                UsageLine(
                    account_id=task.account_id,
                    task_id=task.id,
                    model=task.model,
                    tier=task.charge["tier"],
                    output_pixels=task.charge["output_pixels"],
                    input_images=task.charge["input_images"],
                    lines=task.charge["lines"],
                    amount_micros=task.charge["total_micros"],
                    created_at=now,
                )
            )
        if task.webhook_url:
            await enqueue_callback(session, task, self.settings, self.storage, now)

    async def sweep(self) -> int:
        """Requeue or fail tasks whose lease expired, and time out tasks past their deadline.

        Safe to run in every process at once; each row changes under a conditional UPDATE.
        Returns the number of tasks changed.
        """
        now = now_ms()
        changed = 0
        async with self.db.read() as session:
            overdue = (
                await session.scalars(
                    select(Task.id)
                    .where(Task.status.in_(ACTIVE), Task.deadline_at <= now)
                    .limit(500)
                )
            ).all()
            expired = (
                await session.execute(
                    select(Task.id, Task.lease_owner, Task.lease_losses)
                    .where(Task.status == "processing", Task.lease_expires_at < now)
                    .limit(500)
                )
            ).all()
        for task_id in overdue:
            if await self.time_out(task_id):
                log.info("task %s timed out", task_id)
                changed += 1
        for task_id, owner, losses in expired:
            if losses + 1 >= self.settings.max_lease_losses:
                message = (
                    f"the worker running this task stopped responding {losses + 1} time(s); "
                    "giving up"
                )
                ended = await self._finish(
                    task_id,
                    owner,
                    dict(
                        status="failed",
                        error_code=int(ErrorCode.WORKER_LOST),
                        error_message=message,
                        lease_losses=losses + 1,
                    ),
                )
                changed += int(ended)
                continue
            async with self.db.write() as session:
                result = await session.execute(
                    update(Task)
                    .where(
                        Task.id == task_id,
                        Task.status == "processing",
                        Task.lease_owner == owner,
                        Task.lease_expires_at < now,
                    )
                    .values(
                        status="created",
                        lease_owner=None,
                        lease_expires_at=None,
                        lease_losses=Task.lease_losses + 1,
                        available_at=now,
                        updated_at=now,
                    )
                    .execution_options(synchronize_session=False)
                )
            if result.rowcount:  # type: ignore[attr-defined]
                log.warning("task %s lost its lease (worker %s); requeued", task_id, owner)
                changed += 1
        return changed
