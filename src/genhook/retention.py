"""Bounded history: webhook attempts and finished tasks are kept a configurable time.

Pruning deletes in small batches, one short transaction each, so it never holds SQLite's
write lock or a PostgreSQL row lock for long, and a round stops after ``max_batches`` so a
first run on a large backlog spreads over several intervals. Every API process runs it;
deletes of rows already gone are harmless. Usage lines are the billing ledger and are
never pruned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from sqlalchemy import delete, exists, select

from genhook.config import Settings
from genhook.db import Database, Task, WebhookAttempt, WebhookDelivery, now_ms
from genhook.storage import BlobStore

log = logging.getLogger(__name__)

DAY_MS = 86_400_000
TERMINAL = ("completed", "failed", "timeout")


@dataclass
class Pruner:
    settings: Settings
    db: Database
    storage: BlobStore
    batch: int = 1000
    max_batches: int = 20

    async def prune(self, now: int | None = None) -> tuple[int, int]:
        """One round: (webhook attempts deleted, tasks deleted)."""
        now = now_ms() if now is None else now
        attempts = await self.prune_attempts(
            now - int(self.settings.webhook_attempt_retention_days * DAY_MS)
        )
        tasks = 0
        if self.settings.task_retention_days is not None:
            tasks = await self.prune_tasks(now - int(self.settings.task_retention_days * DAY_MS))
        if attempts or tasks:
            log.info("pruned %d webhook attempt(s) and %d finished task(s)", attempts, tasks)
        return attempts, tasks

    async def prune_attempts(self, before: int) -> int:
        deleted = 0
        for _ in range(self.max_batches):
            # Ids grow with time: the oldest attempts come first, no index on started_at needed.
            oldest = (
                select(WebhookAttempt.id)
                .where(WebhookAttempt.started_at < before)
                .order_by(WebhookAttempt.id)
                .limit(self.batch)
            )
            async with self.db.write() as session:
                ids = list((await session.scalars(oldest)).all())
                if ids:
                    await session.execute(delete(WebhookAttempt).where(WebhookAttempt.id.in_(ids)))
            deleted += len(ids)
            if len(ids) < self.batch:
                break
        return deleted

    async def prune_tasks(self, before: int) -> int:
        """Finished tasks (with their deliveries, attempts and outputs) older than ``before``;
        a task whose webhook is still being delivered waits for the delivery to end."""
        pending = exists().where(
            WebhookDelivery.task_id == Task.id, WebhookDelivery.status == "pending"
        )
        deleted = 0
        for _ in range(self.max_batches):
            old = (
                select(Task.id, Task.outputs)
                .where(Task.status.in_(TERMINAL), Task.finished_at < before, ~pending)
                .order_by(Task.finished_at)
                .limit(self.batch)
            )
            async with self.db.write() as session:
                rows = (await session.execute(old)).all()
                ids = [task_id for task_id, _ in rows]
                if ids:
                    deliveries = select(WebhookDelivery.id).where(WebhookDelivery.task_id.in_(ids))
                    await session.execute(
                        delete(WebhookAttempt).where(WebhookAttempt.delivery_id.in_(deliveries))
                    )
                    await session.execute(
                        delete(WebhookDelivery).where(WebhookDelivery.task_id.in_(ids))
                    )
                    await session.execute(delete(Task).where(Task.id.in_(ids)))
            # Outputs go once their rows are gone: a crash in between leaves a stray blob,
            # never a task pointing at a missing one.
            for _, outputs in rows:
                for key in outputs or []:
                    with contextlib.suppress(Exception):
                        await self.storage.delete(key)
            deleted += len(ids)
            if len(ids) < self.batch:
                break
        return deleted


async def prune_forever(pruner: Pruner, interval: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            await pruner.prune()
        except Exception:
            log.exception("pruning failed; retrying")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
