"""The terminal transition, the one way a task ends: completed, failed, canceled, timed out
(a deadline, or a start deadline never met) and failed after too many lost leases alike.

A conditional UPDATE ends the tasks that are still the caller's to end and returns their
rows; in the same transaction ``end_tasks`` then deletes their input blobs (one DELETE),
writes the usage lines of the completed ones that carry a charge (one multi-row INSERT) and
publishes ``TaskEnded`` for each with a webhook (``tasks/outbox.py``), in the order they
ended. The completion of the worker's hot path runs its own
measured UPDATE on the driver connection and the same ``end_tasks``
(``complete_in``); every other ending goes through ``end_where``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from genhook import metrics
from genhook.config import Settings
from genhook.db import Task
from genhook.db.driver import SessionTx, Tx
from genhook.statuses import TaskStatus
from genhook.storage import BlobStore
from genhook.task_states import ACTIVE
from genhook.tasks.outbox import Outbox, publish_ended
from genhook.tasks.store import clocks
from genhook.tasks.store.hot_path import (
    COMPLETE,
    COMPLETE_WITH_STT,
    INSERT_USAGE,
    claimed,
    delete_blobs,
    keys_params,
    usage_row,
)

if TYPE_CHECKING:
    from genhook.tasks.lifecycle import Completion


def retention_ms(settings: Settings) -> int:
    """How long a task's outputs are kept after it ends."""
    return int(settings.output_retention.total_seconds() * 1000)


async def end_tasks(
    tx: Tx,
    tasks: Sequence[Task],
    now: int,
    settings: Settings,
    storage: BlobStore,
    outbox: Outbox,
    upstream_costs: Mapping[str, int | None] | None = None,
) -> None:
    """What follows the conditional UPDATE that ended ``tasks``, in its transaction."""
    input_keys = [entry["blob"] for task in tasks for entry in task.inputs if "blob" in entry]
    if input_keys:
        await tx.run(delete_blobs(len(input_keys)), keys_params(input_keys))
    costs = upstream_costs or {}
    usage = [
        usage_row(task, now, costs.get(task.id))
        for task in tasks
        if task.status == TaskStatus.COMPLETED and task.charge
    ]
    if usage:
        await tx.run_many(INSERT_USAGE, usage)
    await clocks.correct(tx, tasks, now)
    for task in tasks:  # in the order the tasks ended
        if task.webhook_url:
            await publish_ended(outbox, tx, task, settings, storage, now)


async def end_where(
    session: AsyncSession,
    conditions: Sequence[Any],
    values: Mapping[str, Any],
    now: int,
    settings: Settings,
    storage: BlobStore,
    outbox: Outbox,
    upstream_cost_micros: int | None = None,
) -> list[Task]:
    """End the tasks that meet ``conditions`` with ``values`` (a terminal ``status``, the
    error), in the caller's transaction; returns them as they now stand."""
    stmt = (
        update(Task)
        .where(*conditions)
        .values(
            **values,
            lease_owner=None,
            lease_expires_at=None,
            finished_at=now,
            updated_at=now,
            outputs_expire_at=now + retention_ms(settings),
        )
        .returning(Task)
        .execution_options(synchronize_session=False)
    )
    tasks = list((await session.execute(stmt)).scalars().all())
    costs = {task.id: upstream_cost_micros for task in tasks}
    await end_tasks(SessionTx(session), tasks, now, settings, storage, outbox, costs)
    return tasks


async def complete_in(
    tx: Tx,
    settings: Settings,
    storage: BlobStore,
    outbox: Outbox,
    worker_id: str,
    items: Sequence[Completion],
    now: int,
) -> list[bool]:
    """End ``items`` as completed in the caller's transaction; per item, whether it was still
    this worker's to end (processing under its lease)."""
    expire_at = now + retention_ms(settings)
    done: list[bool] = []
    ended: list[Task] = []
    costs: dict[str, int | None] = {}
    for item in items:
        params = {
            "task_id": item.task_id,
            "owner": worker_id,
            "outputs": item.outputs,
            "nsfw": item.nsfw,
            "info": item.info,
            "now": now,
            "expire_at": expire_at,
        }
        if item.stt_result is None:
            row = await tx.first(COMPLETE, params)
        else:
            params["stt_result"] = item.stt_result
            row = await tx.first(COMPLETE_WITH_STT, params)
        done.append(row is not None)
        if row is None:
            continue
        (task,) = claimed([row])
        metrics.finished(task.model, TaskStatus.COMPLETED, task.started_at, now)
        ended.append(task)
        costs[task.id] = item.upstream_cost_micros
    await end_tasks(tx, ended, now, settings, storage, outbox, costs)
    return done


# -- the conditions of an ending ------------------------------------------------------------


def held_by(task_id: str, worker_id: str | None) -> list[Any]:
    """Conditions under which ``worker_id`` (None: the sweeper) may end the task."""
    conditions: list[Any] = [Task.id == task_id]
    if worker_id is None:
        conditions.append(Task.status.in_(ACTIVE))
    else:
        conditions += [Task.status == TaskStatus.PROCESSING, Task.lease_owner == worker_id]
    return conditions


def owned_active(task_id: str, account_id: str) -> list[Any]:
    """An active task of ``account_id`` (a cancellation)."""
    return [Task.id == task_id, Task.account_id == account_id, Task.status.in_(ACTIVE)]


def a_batch_of(conditions: Sequence[Any], batch: int) -> list[Any]:
    """``conditions`` limited to ``batch`` tasks not locked by another sweeper (the
    sweeper's expiry, a batch per UPDATE)."""
    chosen = select(Task.id).where(*conditions).limit(batch).with_for_update(skip_locked=True)
    return [Task.id.in_(chosen.scalar_subquery()), *conditions]
