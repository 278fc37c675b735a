"""Every read of ``tasks``, ``blobs``, ``usage_lines`` and ``idempotency_keys`` outside the
worker's hot path (whose reads are in ``hot_path``): what the API and the console answer
from, the watcher's, the sweeper's and the reconciler's selects, retention's, admission's,
and the few other lookups of the worker, metrics, tracing and the database blob store.

Callers hold the session (or the connection) and call these; each runs the one statement it
always ran, so moving it here changed no SQL and no round trip.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, Select, and_, case, exists, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.elements import ColumnElement

from genhook.db import Blob, Database, IdempotencyKey, Task, TaskEvent, UsageLine, now_ms
from genhook.statuses import TaskStatus
from genhook.task_states import ACTIVE, TERMINAL
from genhook.tasks.liveness import LIVE_SUFFIX

# Only an id's spelling reaches the database (PostgreSQL refuses NUL in text).
ID_SPELLING = re.compile(r"[A-Za-z0-9_-]{1,64}")


async def get_task(db: Database, task_id: str) -> Task | None:
    if not ID_SPELLING.fullmatch(task_id):
        return None
    async with db.read() as session:
        return await session.get(Task, task_id)


async def owned_task(db: Database, account_id: str, task_id: str) -> Task | None:
    """The task, or None when it does not exist or belongs to another account."""
    task = await get_task(db, task_id)
    return task if task is not None and task.account_id == account_id else None


async def list_tasks(
    db: Database,
    *,
    account_id: str | None,
    statuses: Sequence[str] | None,
    model: str | None,
    since_ms: int | None,
    before: tuple[int, str] | None,
    limit: int,
) -> list[Task]:
    """Tasks newest first; ``before`` is the (created_at, id) of the last one already shown."""
    stmt = select(Task)
    if account_id is not None:
        stmt = stmt.where(Task.account_id == account_id)
    if statuses is not None:
        stmt = stmt.where(Task.status.in_(statuses))
    if model:
        stmt = stmt.where(Task.model == model)
    if since_ms is not None:
        stmt = stmt.where(Task.created_at >= since_ms)
    if before is not None:
        created, task_id = before
        stmt = stmt.where(
            or_(Task.created_at < created, and_(Task.created_at == created, Task.id < task_id))
        )
    stmt = stmt.order_by(Task.created_at.desc(), Task.id.desc()).limit(limit)
    async with db.read() as session:
        return list((await session.scalars(stmt)).all())


# The request fields that say what a task was asked for, in the order a list shows the first.
_ASKED_FOR = ("prompt", "text")


async def task_prompts(
    db: Database, task_ids: Sequence[str], *, account_id: str | None
) -> dict[str, str]:
    """What each listed task was asked for (its prompt, or the text to speak), for a list
    that shows it beside the id; ``account_id=None`` reads any account's (admins)."""
    if not task_ids:
        return {}
    stmt = select(Task.id, Task.params).where(Task.id.in_(list(task_ids)))
    if account_id is not None:
        stmt = stmt.where(Task.account_id == account_id)
    async with db.read() as session:
        rows = (await session.execute(stmt)).all()
    prompts: dict[str, str] = {}
    for task_id, params in rows:
        for name in _ASKED_FOR:
            value = params.get(name) if isinstance(params, dict) else None
            if isinstance(value, str) and value:
                prompts[task_id] = value
                break
    return prompts


@dataclass(frozen=True)
class UsagePage:
    total_micros: int
    task_count: int
    lines: list[UsageLine]


async def usage_page(db: Database, account_id: str, limit: int, cursor: int | None) -> UsagePage:
    """The account's totals and up to ``limit`` usage lines with ids below ``cursor``."""
    async with db.read() as session:
        total, count = (
            await session.execute(
                select(func.coalesce(func.sum(UsageLine.amount_micros), 0), func.count()).where(
                    UsageLine.account_id == account_id
                )
            )
        ).one()
        stmt = (
            select(UsageLine)
            .where(UsageLine.account_id == account_id)
            .order_by(UsageLine.id.desc())
            .limit(limit)
        )
        if cursor is not None:
            stmt = stmt.where(UsageLine.id < cursor)
        rows = list((await session.scalars(stmt)).all())
    return UsagePage(int(total), int(count), rows)


async def task_in(session: AsyncSession, task_id: str) -> Task | None:
    """The task, in the caller's session."""
    return await session.get(Task, task_id)


# -- the watcher (``tasks/watch.py``) --------------------------------------------------------


async def queue_position(session: AsyncSession, task: Task, fair: bool = False) -> int:
    """Runnable tasks of the same model that a worker takes before this one: those older,
    or in fair order (``fair``) those of smaller tags. Fair order makes it an estimate:
    a later submit of an account that has used less may still go ahead, and a
    higher-priority task of the same account takes this one's turn."""
    order = (Task.fair_tag, task.fair_tag) if fair else (Task.available_at, task.available_at)
    column, value = order
    ahead = await session.scalar(
        select(func.count())
        .select_from(Task)
        .where(
            Task.status == TaskStatus.CREATED,
            Task.model == task.model,
            Task.deadline_at > now_ms(),
            or_(column < value, (column == value) & (Task.id < task.id)),
        )
    )
    return int(ahead or 0)


async def signatures(session: AsyncSession, task_ids: Sequence[str]) -> list[tuple[str, str, int]]:
    """(id, stored status, last event id or 0) of each of ``task_ids`` that exists, in one
    statement."""
    last = (
        select(func.max(TaskEvent.id))
        .where(TaskEvent.task_id == Task.id)
        .correlate(Task)
        .scalar_subquery()
    )
    rows = await session.execute(select(Task.id, Task.status, last).where(Task.id.in_(task_ids)))
    return [(task_id, status, int(event_id or 0)) for task_id, status, event_id in rows]


# -- the sweeper and the reconciler (``tasks/lifecycle.py``) ---------------------------------


async def ended_without(
    session: AsyncSession,
    since: int,
    now: int,
    limit: int,
    without_event: Callable[[Select[Task], Any], Select[Task]],
) -> Sequence[Task]:
    """Tasks that ended between ``since`` and ``now`` with a webhook, oldest first, that
    ``without_event`` (the outbox port's condition on the task id column) keeps: the
    reconciler's tasks without a terminal event."""
    ended = select(Task).where(
        Task.finished_at >= since,
        Task.finished_at <= now,
        Task.status.in_(TERMINAL),
        Task.webhook_url.is_not(None),
    )
    missing = without_event(ended, Task.id).order_by(Task.finished_at).limit(limit)
    return (await session.scalars(missing)).all()


async def expired_leases(
    session: AsyncSession, now: int, limit: int = 500
) -> Sequence[Row[str, str | None, int]]:
    """(id, lease owner, lost leases) of running tasks whose lease ran out."""
    return (
        await session.execute(
            select(Task.id, Task.lease_owner, Task.lease_losses)
            .where(Task.status == TaskStatus.PROCESSING, Task.lease_expires_at < now)
            .limit(limit)
        )
    ).all()


async def held_by_live_owners(
    session: AsyncSession, limit: int = 500
) -> Sequence[Row[str, str | None, int]]:
    """(id, lease owner, lost leases) of running tasks of standalone workers
    (``tasks/liveness.py``)."""
    return (
        await session.execute(
            select(Task.id, Task.lease_owner, Task.lease_losses)
            .where(Task.status == TaskStatus.PROCESSING, Task.lease_owner.endswith(LIVE_SUFFIX))
            .limit(limit)
        )
    ).all()


async def held_by(session: AsyncSession, worker_id: str) -> Sequence[Row[str, int]]:
    """(id, lost leases) of every task ``worker_id`` runs."""
    return (
        await session.execute(
            select(Task.id, Task.lease_losses).where(
                Task.status == TaskStatus.PROCESSING, Task.lease_owner == worker_id
            )
        )
    ).all()


async def sweep_due(session: AsyncSession, now: int, *, postgres: bool) -> bool:
    """Whether the sweep has anything to change: one read, the idle sweep's only cost."""
    checks = [
        exists().where(Task.status.in_(ACTIVE), Task.deadline_at <= now),
        exists().where(Task.status == TaskStatus.CREATED, Task.start_deadline_at <= now),
        exists().where(Task.status == TaskStatus.PROCESSING, Task.lease_expires_at < now),
    ]
    if postgres:  # a standalone worker's task: is its worker still there?
        checks.append(
            exists().where(
                Task.status == TaskStatus.PROCESSING, Task.lease_owner.endswith(LIVE_SUFFIX)
            )
        )
    return bool(await session.scalar(select(or_(*checks))))


def overdue(now: int) -> list[ColumnElement[bool]]:
    """Active tasks past their deadline."""
    return [Task.status.in_(ACTIVE), Task.deadline_at <= now]


def unstarted(now: int) -> list[ColumnElement[bool]]:
    """Waiting tasks past their start deadline."""
    return [Task.status == TaskStatus.CREATED, Task.start_deadline_at <= now]


async def any_task(session: AsyncSession, conditions: Sequence[Any]) -> bool:
    """Whether a task meets ``conditions`` (``overdue``, ``unstarted``)."""
    return await session.scalar(select(Task.id).where(*conditions).limit(1)) is not None


# -- retention (``tasks/retention.py``) ------------------------------------------------------


async def outputs_due(
    session: AsyncSession, moment: int, limit: int
) -> Sequence[Row[str, list[Any], list[Any]]]:
    """(id, outputs, inputs) of tasks whose outputs expired by ``moment``, oldest first."""
    return (
        await session.execute(
            select(Task.id, Task.outputs, Task.inputs)
            .where(Task.outputs_purged_at.is_(None), Task.outputs_expire_at <= moment)
            .order_by(Task.outputs_expire_at)
            .limit(limit)
        )
    ).all()


async def expired_keys(session: AsyncSession, now: int, limit: int) -> Sequence[Row[str, str]]:
    """(account id, key) of ``Idempotency-Key`` rows expired by ``now``."""
    return (
        await session.execute(
            select(IdempotencyKey.account_id, IdempotencyKey.key)
            .where(IdempotencyKey.expires_at <= now)
            .limit(limit)
        )
    ).all()


def _prunable(
    before: int, limit: int, pending: Callable[[Any], ColumnElement[bool]]
) -> Select[str, list[str]]:
    return (
        select(Task.id, Task.outputs)
        .where(Task.status.in_(TERMINAL), Task.finished_at < before, ~pending(Task.id))
        .order_by(Task.finished_at)
        .limit(limit)
    )


async def any_prunable(
    session: AsyncSession, before: int, limit: int, pending: Callable[[Any], ColumnElement[bool]]
) -> bool:
    """Whether a task finished before ``before`` without a delivery ``pending`` (the outbox
    port's condition on the task id column)."""
    return (await session.execute(_prunable(before, limit, pending).limit(1))).first() is not None


async def prunable(
    session: AsyncSession, before: int, limit: int, pending: Callable[[Any], ColumnElement[bool]]
) -> Sequence[Row[str, list[str]]]:
    """(id, outputs) of up to ``limit`` such tasks, oldest first."""
    return (await session.execute(_prunable(before, limit, pending))).all()


# -- admission (``tasks/admission.py``) ------------------------------------------------------


async def idempotency_key(
    session: AsyncSession, account_id: str, key: str
) -> IdempotencyKey | None:
    return await session.get(IdempotencyKey, (account_id, key))


async def in_flight(session: AsyncSession, account_id: str) -> int:
    """The account's active tasks."""
    count = await session.scalar(
        select(func.count())
        .select_from(Task)
        .where(Task.account_id == account_id, Task.status.in_(ACTIVE))
    )
    return int(count or 0)


# -- the worker, progress, metrics, tracing, the database blob store --------------------------


async def outputs_of(session: AsyncSession, task_id: str) -> list[str] | None:
    """The outputs a task has recorded."""
    outputs: list[str] | None = await session.scalar(select(Task.outputs).where(Task.id == task_id))
    return outputs


async def running_owner(session: AsyncSession, task_id: str) -> str | None:
    """The lease owner of a running task; None when it is not running."""
    owner: str | None = await session.scalar(
        select(Task.lease_owner).where(Task.id == task_id, Task.status == TaskStatus.PROCESSING)
    )
    return owner


async def waiting_by_model(session: AsyncSession) -> Sequence[Row[str, int, int]]:
    """(model, waiting tasks, oldest created_at) of the tasks not yet started."""
    return (
        await session.execute(
            select(Task.model, func.count(), func.min(Task.created_at))
            .where(Task.status == TaskStatus.CREATED)
            .group_by(Task.model)
        )
    ).all()


@dataclass(frozen=True, slots=True)
class AccountQueue:
    """One account's tasks waiting and running now, and the worker time its tasks held
    since the start of a window."""

    account_id: str
    waiting: int = 0
    running: int = 0
    worker_ms: int = 0


async def account_queues(session: AsyncSession, since: int, now: int) -> list[AccountQueue]:
    """Every account with a task waiting or running, or one that held a worker since
    ``since``: two grouped reads, the active tasks (``ix_tasks_account_status``) and the
    ones finished since ``since`` (``ix_tasks_finished``). Worker time is the part of each
    run inside the window: ``finished_at`` (or ``now`` while running) less ``started_at``
    (or ``since`` when it started before)."""
    start = case((Task.started_at > since, Task.started_at), else_=since)
    active = (
        select(
            Task.account_id,
            func.count().filter(Task.status == TaskStatus.CREATED),
            func.count().filter(Task.status == TaskStatus.PROCESSING),
            func.coalesce(
                func.sum(case((Task.status == TaskStatus.PROCESSING, now - start), else_=0)), 0
            ),
        )
        .where(Task.status.in_((TaskStatus.CREATED, TaskStatus.PROCESSING)))
        .group_by(Task.account_id)
    )
    finished = (
        select(Task.account_id, func.sum(Task.finished_at - start))
        .where(Task.finished_at >= since, Task.started_at.is_not(None))
        .group_by(Task.account_id)
    )
    queues: dict[str, AccountQueue] = {}
    for account_id, waiting, running, held in (await session.execute(active)).all():
        queues[account_id] = AccountQueue(account_id, int(waiting), int(running), int(held))
    for account_id, held in (await session.execute(finished)).all():
        earlier = queues.get(account_id, AccountQueue(account_id))
        queues[account_id] = AccountQueue(
            account_id, earlier.waiting, earlier.running, earlier.worker_ms + max(0, int(held or 0))
        )
    return list(queues.values())


async def blob(session: AsyncSession, key: str) -> tuple[bytes, str] | None:
    """A blob's bytes and content type (the ``database`` storage backend)."""
    row = (
        await session.execute(select(Blob.data, Blob.content_type).where(Blob.key == key))
    ).first()
    return (bytes(row[0]), row[1]) if row else None
