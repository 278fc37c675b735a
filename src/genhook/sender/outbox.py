"""The transactional outbox: the delivery row commits with the task's terminal state.

The body is serialized once, here, and every attempt sends exactly
these bytes; only the timestamp and signatures change per attempt.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from genhook.db import Task
from genhook.db.driver import Tx, as_tx
from genhook.runtime import wakeups
from genhook.sender.queue import insert_delivery
from genhook.task_states import COMPLETED, TIMEOUT, TIMEOUT_MESSAGE, is_terminal

FAILED_ERROR = "The task failed."


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
        "status": "OK" if task.status == COMPLETED else "ERROR",
        "created_at": int(task.created_at),
        "payload": data,
    }
    if task.status != COMPLETED:
        if task.error_code is not None:
            data["error_code"] = int(task.error_code)
        if task.status == TIMEOUT:
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
    commits (``genhook.wakeups``).
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
