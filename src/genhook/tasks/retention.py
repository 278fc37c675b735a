"""Retention: outputs are deleted ``output_retention`` after their task ends, and history
(webhook attempts, and finished tasks when ``task_retention_days`` is set) is kept a
configurable time.

The job runs beside webhook reconciliation (the dispatcher role). Each pass takes at most
``retention_batch`` tasks in expiry order through an index, so its work is bounded however
far behind it is. A deleted output leaves a tombstone first, so its URL answers 410 (never
a 404 that looks like a wrong link); the task row keeps its history. Expired
``Idempotency-Key`` rows go in the same pass. History is pruned in small batches, one short
transaction each, so it never holds SQLite's write lock or a PostgreSQL row lock for long,
and a round stops after ``max_batches`` so a first run on a large backlog spreads over
several intervals. Usage lines are the billing ledger and are never pruned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from sqlalchemy import delete

from genhook.config import Settings
from genhook.db import (
    Database,
    ExpiredOutput,
    TaskEvent,
    now_ms,
)
from genhook.db.driver import SessionTx
from genhook.db.upsert import upsert
from genhook.errors import Gone
from genhook.storage import BlobStore
from genhook.storage.inputs import keeps_inputs
from genhook.tasks.outbox import Outbox, TasksDeleted, webhook_outbox
from genhook.tasks.store import reads, writes
from genhook.tasks.views import iso_ms

log = logging.getLogger(__name__)

DAY_MS = 86_400_000


async def raise_if_expired(db: Database, key: str) -> None:
    """410 for an output that retention deleted."""
    async with db.read() as session:
        row = await session.get(ExpiredOutput, key)
    if row is not None:
        raise Gone(
            f"this output expired and was deleted at {iso_ms(row.expired_at)} "
            "(GENHOOK_OUTPUT_RETENTION)"
        )


@dataclass
class Pruner:
    settings: Settings
    db: Database
    storage: BlobStore
    batch: int = 1000
    max_batches: int = 20
    outbox: Outbox = field(default_factory=webhook_outbox)

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
        return await self.outbox.prune_attempts(self.db, before, self.batch, self.max_batches)

    async def prune_tasks(self, before: int) -> int:
        """Finished tasks (with their deliveries, attempts and outputs) older than ``before``;
        a task whose webhook is still being delivered waits for the delivery to end."""
        pending = self.outbox.pending_event
        deleted = 0
        for _ in range(self.max_batches):
            async with self.db.read() as session:  # read first: an idle pass writes nothing
                if not await reads.any_prunable(session, before, self.batch, pending):
                    break
            async with self.db.write() as session:
                rows = await reads.prunable(session, before, self.batch, pending)
                ids = [task_id for task_id, _ in rows]
                if ids:
                    await self.outbox.tasks_deleted(SessionTx(session), TasksDeleted(ids))
                    await session.execute(delete(TaskEvent).where(TaskEvent.task_id.in_(ids)))
                    await writes.delete_tasks(session, ids)
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


@dataclass
class RetentionReport:
    tasks: int = 0
    outputs: int = 0
    idempotency_keys: int = 0
    # History pruned: webhook attempts, and whole finished tasks.
    attempts: int = 0
    pruned_tasks: int = 0


class Retention:
    def __init__(
        self, settings: Settings, db: Database, storage: BlobStore, outbox: Outbox | None = None
    ) -> None:
        self.settings = settings
        self.db = db
        self.storage = storage
        self.pruner = Pruner(settings, db, storage, outbox=outbox or webhook_outbox())

    async def run_once(self, *, now: int | None = None) -> RetentionReport:
        moment = now if now is not None else now_ms()
        report = RetentionReport()
        batch = self.settings.retention_batch
        async with self.db.read() as session:
            due = await reads.outputs_due(session, moment, batch)
        if due:
            tombstones = [
                {"key": key, "task_id": task_id, "expired_at": moment}
                for task_id, outputs, _ in due
                for key in outputs
            ]
            if tombstones:
                async with self.db.write() as session:
                    await session.execute(
                        upsert(ExpiredOutput, postgres=self.db.is_postgres).on_conflict_do_nothing(
                            index_elements=[ExpiredOutput.key]
                        ),
                        tombstones,
                    )
            for tombstone in tombstones:
                await self.storage.delete(tombstone["key"])
            input_keys = [item["blob"] for _, _, inputs in due for item in inputs if "blob" in item]
            if keeps_inputs(self.storage):
                for key in input_keys:
                    await self.storage.delete(key)
            async with self.db.write() as session:
                ids = [task_id for task_id, _, _ in due]
                await writes.purge_outputs(session, ids, input_keys, moment)
            report.tasks = len(due)
            report.outputs = len(tombstones)
        report.idempotency_keys = await self._drop_expired_keys(moment, batch)
        report.attempts, report.pruned_tasks = await self.pruner.prune(moment)
        if report.tasks or report.idempotency_keys:
            log.info(
                "retention: deleted %d output(s) of %d task(s), %d expired idempotency key(s)",
                report.outputs,
                report.tasks,
                report.idempotency_keys,
            )
        return report

    async def _drop_expired_keys(self, now: int, batch: int) -> int:
        async with self.db.read() as session:
            keys = await reads.expired_keys(session, now, batch)
        dropped = 0
        if not keys:
            return 0
        async with self.db.write() as session:
            for account_id, key in keys:
                dropped += await writes.drop_expired_key(session, account_id, key, now)
        return dropped

    async def run_forever(self, stop: asyncio.Event) -> None:
        """One pass per interval; a full batch goes again at once to catch up."""
        while not stop.is_set():
            full = False
            try:
                report = await self.run_once()
                full = report.tasks >= self.settings.retention_batch
            except Exception:
                log.exception("retention pass failed; retrying next interval")
            if full:
                await asyncio.sleep(0)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.retention_interval_seconds)
