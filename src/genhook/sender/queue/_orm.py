"""The other writes of webhook_deliveries, webhook_attempts and webhook_replays, and the
conditions the task domain's statements take from them.

Enqueue, give up superseded progress events, clear leases, defer behind an open circuit,
rearm for a redelivery, prune. Each runs in its caller's transaction, so an outbox row still
commits with its task's terminal state. The same SQL serves both backends (ORM).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any, TypeVar, cast

from sqlalchemy import (
    ColumnElement,
    Select,
    Table,
    bindparam,
    delete,
    exists,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from genhook.db import Database, Task, WebhookAttempt, WebhookDelivery, WebhookReplay
from genhook.db.driver import Tx, bound_insert
from genhook.sender.fairness import destination_of, endpoint_of
from genhook.sender.queue._port import NEXT_DUE
from genhook.statuses import DeliveryStatus

_NEXT_DUE_READ = text(NEXT_DUE)


def new_delivery_id() -> str:
    return "whd_" + secrets.token_hex(12)


_INSERT_DELIVERY = bound_insert(
    cast(Table, WebhookDelivery.__table__),
    (
        "id",
        "task_id",
        "account_id",
        "url",
        "destination",
        "endpoint",
        "event_type",
        "body",
        "status",
        "attempts",
        "round_start",
        "redeliveries",
        "next_attempt_at",
        "created_at",
        "updated_at",
        "trace_context",
    ),
)


async def insert_delivery(
    tx: Tx, task: Task, url: str, event_type: str, body: bytes, now: int
) -> str:
    """A delivery of ``body`` to ``url``, due at once; returns its id.

    One prebuilt Core statement: it runs in every terminal transaction with a webhook,
    usually the worker's driver transaction (``genhook.db.driver``)."""
    delivery_id = new_delivery_id()
    await tx.run(
        _INSERT_DELIVERY,
        {
            "id": delivery_id,
            "task_id": task.id,
            "account_id": task.account_id,
            "url": url,
            "destination": destination_of(url),
            "endpoint": endpoint_of(url),
            "event_type": event_type,
            "body": body,
            "status": DeliveryStatus.PENDING,
            "attempts": 0,
            "round_start": 0,
            "redeliveries": 0,
            "next_attempt_at": now,
            "created_at": now,
            "updated_at": now,
            "trace_context": task.trace_context,
        },
    )
    return delivery_id


def _lease_free(now: int) -> ColumnElement[bool]:
    return or_(WebhookDelivery.lease_expires_at.is_(None), WebhookDelivery.lease_expires_at < now)


_deliveries = cast(Table, WebhookDelivery.__table__)
_EVENT_OF_TASK = select(_deliveries.c.id).where(
    _deliveries.c.task_id == bindparam("of_task"),
    _deliveries.c.event_type == bindparam("event_type"),
)
# A task's pending progress events, not in flight: given up in its terminal transaction.
_GIVE_UP_TASK_PROGRESS = (
    update(_deliveries)
    .where(
        _deliveries.c.task_id == bindparam("of_task"),
        _deliveries.c.status == DeliveryStatus.PENDING,
        _deliveries.c.event_type.like("%.task.processing"),
        or_(
            _deliveries.c.lease_expires_at.is_(None),
            _deliveries.c.lease_expires_at < bindparam("now"),
        ),
    )
    .values(
        status=DeliveryStatus.UNDELIVERABLE,
        last_error=bindparam("reason"),
        updated_at=bindparam("now"),
    )
)


async def event_enqueued(tx: Tx, task_id: str, event_type: str) -> bool:
    """Whether ``task_id`` already has a delivery of ``event_type``."""
    params = {"of_task": task_id, "event_type": event_type}
    return await tx.first(_EVENT_OF_TASK, params) is not None


async def give_up_task_progress(tx: Tx, task_id: str, reason: str, now: int) -> int:
    """In ``task_id``'s terminal transaction: its pending progress events not in flight
    become undeliverable."""
    params = {"of_task": task_id, "reason": reason, "now": now}
    return await tx.run(_GIVE_UP_TASK_PROGRESS, params)


async def give_up_progress(session: AsyncSession, reason: str, now: int) -> int:
    """Pending progress events not in flight whose task's terminal event exists become
    undeliverable."""
    terminal = aliased(WebhookDelivery)
    which = [
        WebhookDelivery.status == DeliveryStatus.PENDING,
        WebhookDelivery.event_type.like("%.task.processing"),
        _lease_free(now),
        exists(
            select(terminal.id).where(
                terminal.task_id == WebhookDelivery.task_id,
                terminal.event_type.like("%.task.terminal"),
            )
        ),
    ]
    result = await session.execute(
        update(WebhookDelivery)
        .where(*which)
        .values(status=DeliveryStatus.UNDELIVERABLE, last_error=reason, updated_at=now)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


async def clear_expired_leases(session: AsyncSession, now: int) -> int:
    result = await session.execute(
        update(WebhookDelivery)
        .where(
            WebhookDelivery.status == DeliveryStatus.PENDING, WebhookDelivery.lease_expires_at < now
        )
        .values(lease_owner=None, lease_expires_at=None, updated_at=now)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


async def release_leases(session: AsyncSession, owner: str, now: int) -> int:
    """Deliveries ``owner`` still holds are due again at once (a sender's graceful stop);
    returns how many."""
    result = await session.execute(
        update(WebhookDelivery)
        .where(
            WebhookDelivery.status == DeliveryStatus.PENDING, WebhookDelivery.lease_owner == owner
        )
        .values(lease_owner=None, lease_expires_at=None, next_attempt_at=now, updated_at=now)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


async def defer_circuit(
    session: AsyncSession, account_id: str, scope: str, target: str, until: int, now: int
) -> None:
    """Due, unclaimed deliveries of ``account_id`` to ``target`` (its endpoint, or with scope
    host its ``scheme://host:port``) wait until ``until`` (the circuit opened); no attempt
    is counted."""
    column = WebhookDelivery.endpoint if scope == "endpoint" else WebhookDelivery.destination
    await session.execute(
        update(WebhookDelivery)
        .where(
            WebhookDelivery.status == DeliveryStatus.PENDING,
            WebhookDelivery.account_id == account_id,
            column == target,
            WebhookDelivery.lease_owner.is_(None),
            WebhookDelivery.next_attempt_at < until,
        )
        .values(next_attempt_at=until, updated_at=now)
        .execution_options(synchronize_session=False)
    )


def _rearmed(now: int) -> dict[str, Any]:
    """A fresh retry budget, due now."""
    return {
        "status": DeliveryStatus.PENDING,
        "round_start": WebhookDelivery.attempts,
        "redeliveries": WebhookDelivery.redeliveries + 1,
        "next_attempt_at": now,
        "lease_owner": None,
        "lease_expires_at": None,
        "updated_at": now,
    }


async def rearm_delivery(
    session: AsyncSession, delivery_id: str, first_attempt: int, now: int
) -> bool:
    """Redeliver one delivery unless an attempt is in flight (False), recording the replay."""
    result = await session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.id == delivery_id, _lease_free(now))
        .values(**_rearmed(now))
        .execution_options(synchronize_session=False)
    )
    if not result.rowcount:  # type: ignore[attr-defined]
        return False
    await session.execute(
        insert(WebhookReplay).values(
            delivery_id=delivery_id, first_attempt=first_attempt, bulk=False, requested_at=now
        )
    )
    return True


async def rearm_deliveries(
    session: AsyncSession, ids: Sequence[str], status: str, now: int
) -> list[str]:
    """Redeliver those of ``ids`` still in ``status``, recording a bulk replay of each."""
    if not ids:
        return []
    result = await session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.id.in_(ids), WebhookDelivery.status == status)
        .values(**_rearmed(now))
        .returning(WebhookDelivery.id, WebhookDelivery.attempts)
        .execution_options(synchronize_session=False)
    )
    rows = [(r[0], int(r[1])) for r in result.all()]
    if rows:
        await session.execute(
            insert(WebhookReplay),
            [
                {"delivery_id": i, "first_attempt": n + 1, "bulk": True, "requested_at": now}
                for i, n in rows
            ],
        )
    return [delivery_id for delivery_id, _ in rows]


async def delete_attempts(session: AsyncSession, ids: Sequence[int]) -> None:
    await session.execute(delete(WebhookAttempt).where(WebhookAttempt.id.in_(ids)))


async def prune_attempts(db: Database, before: int, batch: int, max_batches: int) -> int:
    """Delete attempts started before ``before``, ``batch`` per short transaction and at most
    ``max_batches`` transactions (retention); returns how many went."""
    deleted = 0
    for _ in range(max_batches):
        # Ids grow with time: the oldest attempts come first, no index on started_at needed.
        oldest = (
            select(WebhookAttempt.id)
            .where(WebhookAttempt.started_at < before)
            .order_by(WebhookAttempt.id)
            .limit(batch)
        )
        async with db.read() as session:  # read first: an idle pass writes nothing
            if await session.scalar(oldest.limit(1)) is None:
                break
        async with db.write() as session:
            ids = list((await session.scalars(oldest)).all())
            if ids:
                await delete_attempts(session, ids)
        deleted += len(ids)
        if len(ids) < batch:
            break
    return deleted


async def delete_deliveries_of(tx: Tx, task_ids: Sequence[str]) -> None:
    """Every delivery of these tasks, with its attempts and replays (tasks being pruned)."""
    deliveries = select(WebhookDelivery.id).where(WebhookDelivery.task_id.in_(task_ids))
    await tx.run(delete(WebhookAttempt).where(WebhookAttempt.delivery_id.in_(deliveries)), {})
    await tx.run(delete(WebhookReplay).where(WebhookReplay.delivery_id.in_(deliveries)), {})
    await tx.run(delete(WebhookDelivery).where(WebhookDelivery.task_id.in_(task_ids)), {})


async def release_deliveries(db: Database, owner: str) -> int:
    """Make the deliveries ``owner`` still holds due again at once: a dispatcher stopping
    gracefully, or its supervisor after it died. Returns how many were released."""
    from genhook.db import now_ms

    async with db.write() as session:
        return await release_leases(session, owner, now_ms())


async def earliest_pending(db: Database) -> int | None:
    """When the next pending delivery is due (a read: an idle dispatcher writes nothing); the
    same statement a tick runs when it reads the next due time."""
    async with db.read() as session:
        earliest = await session.scalar(_NEXT_DUE_READ)
    return None if earliest is None else int(earliest)


# -- conditions for the task domain's statements (through the outbox port) ------------------

_Query = TypeVar("_Query", bound=Select[Any])


def without_terminal_delivery(query: _Query, task_id: ColumnElement[str]) -> _Query:
    """``query`` kept to the tasks (``task_id``, their id column) without a terminal
    delivery: an outer join on the deliveries and ``IS NULL``, inside the caller's
    statement."""
    return query.outerjoin(
        WebhookDelivery,
        (WebhookDelivery.task_id == task_id) & WebhookDelivery.event_type.like("%.task.terminal"),
    ).where(WebhookDelivery.id.is_(None))


def pending_delivery(task_id: ColumnElement[str]) -> ColumnElement[bool]:
    """Whether the task ``task_id`` names has a pending delivery (an EXISTS)."""
    return exists().where(
        WebhookDelivery.task_id == task_id, WebhookDelivery.status == DeliveryStatus.PENDING
    )
