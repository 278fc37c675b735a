"""The transactional outbox: the delivery row commits with the task's terminal state.

``WebhookOutbox`` is the webhook side of the task domain's outbox port
(``genhook.tasks.outbox.Outbox``): it reads the events it is given through protocols of its
own, so this package never imports the task domain. The body is serialized once, here, and
every attempt sends exactly these bytes; only the timestamp and signatures change per
attempt.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar

from sqlalchemy import ColumnElement, Select
from sqlalchemy.ext.asyncio import AsyncSession

from genhook.db import Database, Task, wakeups
from genhook.db.driver import Tx, as_tx
from genhook.sender.queue import (
    delete_deliveries_of,
    insert_delivery,
    pending_delivery,
    prune_attempts,
    without_terminal_delivery,
)
from genhook.statuses import TaskStatus
from genhook.task_states import TIMEOUT_MESSAGE, is_terminal

FAILED_ERROR = "The task failed."

_Query = TypeVar("_Query", bound=Select[Any])


class Started(Protocol):
    """A task a worker just claimed."""

    @property
    def task(self) -> Task: ...

    @property
    def now(self) -> int: ...


class Ended(Started, Protocol):
    """A task that just ended, with its prediction response."""

    @property
    def payload(self) -> Mapping[str, Any]: ...


class Deleted(Protocol):
    """Finished tasks that retention deleted."""

    @property
    def task_ids(self) -> Sequence[str]: ...


class WebhookOutbox:
    """Task events as webhook deliveries, each in the caller's transaction."""

    async def task_started(self, tx: Tx, event: Started) -> None:
        from genhook.sender.events import enqueue_processing

        await enqueue_processing(tx, event.task, event.now)  # opt-in progress event

    async def task_ended(self, tx: Tx, event: Ended) -> None:
        task = event.task
        await enqueue_delivery(
            tx,
            task=task,
            event_type=event_type_for(task.kind),
            payload=dict(event.payload),
            now=event.now,
        )

    async def tasks_deleted(self, tx: Tx, event: Deleted) -> None:
        await delete_deliveries_of(tx, event.task_ids)

    async def prune_attempts(self, db: Database, before: int, batch: int, max_batches: int) -> int:
        return await prune_attempts(db, before, batch, max_batches)

    def without_terminal_event(self, query: _Query, task_id: ColumnElement[str]) -> _Query:
        return without_terminal_delivery(query, task_id)

    def pending_event(self, task_id: ColumnElement[str]) -> ColumnElement[bool]:
        return pending_delivery(task_id)


def event_type_for(kind: str) -> str:
    """``image.task.terminal`` and so on: from the model's kind, not the submit path."""
    return f"{kind}.task.terminal"


def build_body(task: Task, event_type: str, payload: dict[str, Any]) -> bytes:
    """``payload`` is the prediction response of the terminal task."""
    if not is_terminal(task.status):
        raise ValueError(f"task {task.id} is {task.status}, not terminal")
    data = dict(payload)
    data["status"] = task.status
    data.setdefault("model", task.model)
    body: dict[str, Any] = {
        "session_id": task.id,
        "event_type": event_type,
        "status": "OK" if task.status == TaskStatus.COMPLETED else "ERROR",
        "created_at": int(task.created_at),
        "payload": data,
    }
    if task.status != TaskStatus.COMPLETED:
        if task.error_code is not None:
            data["error_code"] = int(task.error_code)
        if task.status == TaskStatus.TIMEOUT:
            # A timeout carries the generic message; it does not vary with the task.
            body["error"] = TIMEOUT_MESSAGE
        else:
            body["error"] = task.error_message or FAILED_ERROR
        data.setdefault("error", body["error"])
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


async def enqueue_delivery(
    tx: Tx | AsyncSession,
    *,
    task: Task,
    event_type: str,
    payload: dict[str, Any],
    now: int,
) -> str:
    """Add the delivery row to the caller's transaction; returns its id.

    Due at once. Dispatchers, in this process and others, are woken when the transaction
    commits (``genhook.db.wakeups``).
    """
    if not task.webhook_url:
        raise ValueError(f"task {task.id} has no webhook_url")
    body = build_body(task, event_type, payload)
    tx = as_tx(tx)
    delivery_id = await insert_delivery(tx, task, task.webhook_url, event_type, body, now)
    # Opt-in progress events: a processing event still pending gives way to this one.
    from genhook.sender.events import supersede_progress

    await supersede_progress(tx, task, now)
    await wake_dispatchers(tx)
    return delivery_id


async def wake_dispatchers(tx: Tx | AsyncSession) -> None:
    """Wake every dispatcher once the caller's transaction commits: a delivery is due."""
    await as_tx(tx).notify(wakeups.DELIVERIES)
