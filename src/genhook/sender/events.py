"""Opt-in progress events: the ``*.task.processing`` event a submit's ``webhook_events`` asks
for (parsed with the submit, ``tasks/submission.py``).

The contract's single terminal event stays the default and is always sent. A task that
asks for ``"processing"`` also gets ``<kind>.task.processing`` when a worker starts it: an
outbox row written in the transaction that claims the task, signed, sent and retried like
any other delivery.

Ordering, as the receiver sees it: the processing event is never received after the
terminal one. The claim statement does not take a delivery while another event of the same
task has an attempt in flight (so the terminal event waits for a processing attempt on the
wire, at most one request timeout), and never takes a processing event once its task's
terminal event exists. The transaction that writes the terminal event gives up a processing
event that is waiting for a retry (``undeliverable``, "superseded by the terminal event");
one whose attempt was in flight then is given up by the reconciliation sweep if that attempt
failed. A processing event is never replayed once the terminal event exists.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import exists, or_, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from genhook.db import Task, WebhookDelivery
from genhook.db.driver import Tx
from genhook.sender.outbox import wake_dispatchers
from genhook.sender.queue import (
    event_enqueued,
    give_up_progress,
    give_up_task_progress,
    insert_delivery,
)
from genhook.statuses import DeliveryStatus, TaskStatus

SUPERSEDED = "superseded by the terminal event"


def wants(task: Task, event: str) -> bool:
    return bool(task.webhook_events) and event in (task.webhook_events or "").split(",")


async def enqueue_processing(tx: Tx, task: Task, now: int) -> None:
    """The processing event's outbox row, in the caller's (claim) transaction; once per
    task, also when a task is claimed again after a lost lease."""
    if not task.webhook_url or not wants(task, TaskStatus.PROCESSING):
        return
    event_type = f"{task.kind}.task.processing"
    if await event_enqueued(tx, task.id, event_type):
        return
    body = {
        "session_id": task.id,
        "event_type": event_type,
        "status": "PROCESSING",
        "created_at": int(task.created_at),
        "payload": {"id": task.id, "model": task.model, "status": TaskStatus.PROCESSING},
    }
    data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    await insert_delivery(tx, task, task.webhook_url, event_type, data, now)
    await wake_dispatchers(tx)


async def supersede_progress(tx: Tx, task: Task, now: int) -> None:
    """In the terminal transaction: a processing event still pending is given up, so the
    terminal event is not held back by its retries (see the module's ordering notes)."""
    if not wants(task, TaskStatus.PROCESSING):
        return
    await give_up_task_progress(tx, task.id, SUPERSEDED, now)


def _stale_progress(now: int) -> list[Any]:
    terminal = aliased(WebhookDelivery)
    return [
        WebhookDelivery.status == DeliveryStatus.PENDING,
        WebhookDelivery.event_type.like("%.task.processing"),
        or_(
            WebhookDelivery.lease_expires_at.is_(None),
            WebhookDelivery.lease_expires_at < now,
        ),
        exists(
            select(terminal.id).where(
                terminal.task_id == WebhookDelivery.task_id,
                terminal.event_type.like("%.task.terminal"),
            )
        ),
    ]


async def stale_progress_exists(session: AsyncSession, now: int) -> bool:
    """Whether ``supersede_stale_progress`` has anything to do (a read, for idle passes)."""
    found = await session.scalar(select(WebhookDelivery.id).where(*_stale_progress(now)).limit(1))
    return found is not None


async def supersede_stale_progress(session: AsyncSession, now: int) -> int:
    """Reconciliation: processing events left pending behind their terminal event (their
    attempt was in flight when the task ended, and failed) are given up."""
    return await give_up_progress(session, SUPERSEDED, now)
