"""The attempt log and redelivery, shared by the HTTP API and the CLI.

Attempt numbers count every attempt of a delivery, from 1, and never restart: a
redelivery continues the numbering (after attempts 1..10, the redelivered attempts are
11, 12, ...) and gives the delivery a fresh retry budget of
``webhook_retry_max_attempts`` attempts. Each redelivery is recorded (``webhook_replays``)
with the first attempt number it covers, so the attempt log can mark replayed attempts.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Literal

from pydantic import BaseModel, Field
from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from genhook.db import Database, WebhookAttempt, WebhookDelivery, WebhookReplay, now_ms
from genhook.errors import (
    Conflict,
    FieldError,
    InvalidRequest,
    NotFound,
    whole_number,
    zoned_time_ms,
)
from genhook.sender.fairness import destination_of
from genhook.sender.outbox import wake_dispatchers
from genhook.sender.queue import rearm_deliveries, rearm_delivery
from genhook.statuses import DeliveryStatus
from genhook.times import iso_ms

MAX_PAGE = 200
# One bulk redelivery touches at most this many deliveries; repeat it for more.
MAX_BULK = 1000


class AttemptView(BaseModel):
    number: int = Field(description="1-based; continues across redeliveries.")
    started_at: str = Field(description="ISO 8601 time the attempt started.")
    duration_ms: int
    status_code: int | None = Field(description="HTTP status, or null when none was received.")
    error: str | None = Field(description="Why the attempt failed; null when acknowledged.")
    response_excerpt: str | None = Field(description="The start of the receiver's response.")
    kid: str | None = Field(description="The Ed25519 key that signed the attempt.")
    replay: bool = Field(description="True when the attempt was sent by a redelivery.")


class DeliveryView(BaseModel):
    id: str
    session_id: str = Field(description="The task id, sent as X-Service-Webhook-Id.")
    event_type: str
    url: str
    status: str = Field(description="pending, delivered or undeliverable.")
    attempts: int
    redeliveries: int
    next_attempt_at: str | None
    last_status_code: int | None
    last_error: str | None
    created_at: str
    delivered_at: str | None
    attempt_log: list[AttemptView]


class DeliveryPage(BaseModel):
    data: list[DeliveryView]
    next_before: str | None = Field(
        description="Pass as ``before`` for the next (older) page; null on the last page."
    )


def _iso(value: int | None) -> str | None:
    return iso_ms(value) if value is not None else None


def _view(
    row: WebhookDelivery, log: list[WebhookAttempt], replays: list[int] | None = None
) -> DeliveryView:
    first_replayed = min(replays) if replays else None
    return DeliveryView(
        id=row.id,
        session_id=row.task_id,
        event_type=row.event_type,
        url=row.url,
        status=row.status,
        attempts=row.attempts,
        redeliveries=row.redeliveries,
        next_attempt_at=_iso(row.next_attempt_at) if row.status == DeliveryStatus.PENDING else None,
        last_status_code=row.last_status_code,
        last_error=row.last_error,
        created_at=iso_ms(row.created_at),
        delivered_at=_iso(row.delivered_at),
        attempt_log=[
            AttemptView(
                number=a.number,
                started_at=iso_ms(a.started_at),
                duration_ms=a.duration_ms,
                status_code=a.status_code,
                error=a.error,
                response_excerpt=a.response_excerpt,
                kid=a.kid,
                replay=first_replayed is not None and a.number >= first_replayed,
            )
            for a in log
        ],
    )


async def list_deliveries(
    db: Database,
    *,
    account_id: str | None,
    session_id: str | None = None,
    status: str | None = None,
    limit: int = 50,
    before: str | None = None,
) -> DeliveryPage:
    """Newest first; ``account_id=None`` lists every account (operator CLI only)."""
    if status is not None and status not in tuple(DeliveryStatus):
        raise InvalidRequest(f"status must be one of {', '.join(DeliveryStatus)}")
    limit = max(1, min(limit, MAX_PAGE))
    if session_id is not None and "\x00" in session_id:
        # No task id holds a NUL, and PostgreSQL refuses one in text.
        return DeliveryPage(data=[], next_before=None)
    query = select(WebhookDelivery)
    if account_id is not None:
        query = query.where(WebhookDelivery.account_id == account_id)
    if session_id is not None:
        query = query.where(WebhookDelivery.task_id == session_id)
    if status is not None:
        query = query.where(WebhookDelivery.status == status)
    if before:
        created, _, last_id = before.partition(":")
        if not created.isdigit() or not last_id or "\x00" in last_id:
            message = "before is not a cursor returned by this endpoint"
            raise InvalidRequest(message, [FieldError("before", message)])
        created_at = whole_number(created, "before")
        query = query.where(
            or_(
                WebhookDelivery.created_at < created_at,
                (WebhookDelivery.created_at == created_at) & (WebhookDelivery.id < last_id),
            )
        )
    query = query.order_by(WebhookDelivery.created_at.desc(), WebhookDelivery.id.desc())
    async with db.read() as session:
        rows = list((await session.scalars(query.limit(limit + 1))).all())
        more = len(rows) > limit
        rows = rows[:limit]
        logs: dict[str, list[WebhookAttempt]] = defaultdict(list)
        if rows:
            attempts = await session.scalars(
                select(WebhookAttempt)
                .where(WebhookAttempt.delivery_id.in_([r.id for r in rows]))
                .order_by(WebhookAttempt.delivery_id, WebhookAttempt.number)
            )
            for attempt in attempts:
                logs[attempt.delivery_id].append(attempt)
        replays = await _replays(session, [r.id for r in rows])
    cursor = f"{rows[-1].created_at}:{rows[-1].id}" if more and rows else None
    return DeliveryPage(
        data=[_view(r, logs[r.id], replays[r.id]) for r in rows], next_before=cursor
    )


async def _replays(session: AsyncSession, ids: list[str]) -> dict[str, list[int]]:
    """The first attempt number of each redelivery, per delivery."""
    found: dict[str, list[int]] = defaultdict(list)
    if ids:
        rows = await session.execute(
            select(WebhookReplay.delivery_id, WebhookReplay.first_attempt).where(
                WebhookReplay.delivery_id.in_(ids)
            )
        )
        for delivery_id, first in rows:
            found[delivery_id].append(first)
    return found


async def owned_delivery(db: Database, delivery_id: str, account_id: str) -> WebhookDelivery | None:
    """The delivery row, or None when it does not exist or belongs to another account."""
    if len(delivery_id) > 64 or "\x00" in delivery_id:  # PostgreSQL refuses NUL in text
        return None
    async with db.read() as session:
        row = await session.get(WebhookDelivery, delivery_id)
    return row if row is not None and row.account_id == account_id else None


async def get_delivery(db: Database, delivery_id: str, *, account_id: str | None) -> DeliveryView:
    async with db.read() as session:
        row = await session.get(WebhookDelivery, delivery_id)
        if row is None or (account_id is not None and row.account_id != account_id):
            raise NotFound(f"no webhook delivery {delivery_id}")
        log = (
            await session.scalars(
                select(WebhookAttempt)
                .where(WebhookAttempt.delivery_id == delivery_id)
                .order_by(WebhookAttempt.number)
            )
        ).all()
        replays = await _replays(session, [delivery_id])
    return _view(row, list(log), replays[delivery_id])


async def redeliver(db: Database, delivery_id: str, *, account_id: str | None) -> DeliveryView:
    """Send again now, whatever the status, with a fresh retry budget.

    Refused (409) while an attempt is in flight. Receivers deduplicate on ``session_id``.
    """
    now = now_ms()
    if "\x00" in delivery_id:  # no id holds one, and PostgreSQL refuses it in text
        raise NotFound(f"no webhook delivery {delivery_id!r}")
    async with db.write() as session:
        row = await session.get(WebhookDelivery, delivery_id)
        if row is None or (account_id is not None and row.account_id != account_id):
            raise NotFound(f"no webhook delivery {delivery_id}")
        if row.event_type.endswith(".task.processing") and await session.scalar(
            select(WebhookDelivery.id).where(
                WebhookDelivery.task_id == row.task_id,
                WebhookDelivery.event_type.like("%.task.terminal"),
            )
        ):
            raise Conflict(
                f"webhook delivery {delivery_id} is a progress event and its task's terminal "
                "event exists; it is not replayed after it"
            )
        if not await rearm_delivery(session, delivery_id, row.attempts + 1, now):
            raise Conflict(f"webhook delivery {delivery_id} has an attempt in flight; retry later")
        await wake_dispatchers(session)
    return await get_delivery(db, delivery_id, account_id=account_id)


class BulkRedelivery(BaseModel):
    """Which of the account's deliveries to send again."""

    status: Literal[DeliveryStatus.UNDELIVERABLE, DeliveryStatus.DELIVERED] = Field(
        DeliveryStatus.UNDELIVERABLE,
        description="Only deliveries in this state (pending ones are queued).",
    )
    since: str = Field(
        description="ISO 8601 time with a zone; only deliveries created at or after it.",
        max_length=64,
        json_schema_extra={"format": "date-time"},
    )
    destination: str | None = Field(
        None,
        description="Only deliveries to this destination (scheme://host:port, or any URL on it).",
        max_length=1024,
    )
    limit: int = Field(100, ge=1, le=MAX_BULK, description="At most this many, oldest first.")


class BulkRedeliveryResult(BaseModel):
    redelivered: int = Field(description="How many deliveries were made due now.")
    ids: list[str]
    more: bool = Field(description="True when the limit was reached: repeat for the rest.")


async def redeliver_many(
    db: Database, request: BulkRedelivery, *, account_id: str | None
) -> BulkRedeliveryResult:
    """Redeliver the deliveries that match ``request``, oldest first, at most ``limit``.

    Idempotent: a matched delivery becomes ``pending``, so the same request again matches
    only deliveries that have ended since (none, until the replays have been attempted).
    Deliveries with an attempt in flight are left out. Progress events whose task's
    terminal event exists are never replayed (the terminal event must stay last).
    """
    since = zoned_time_ms(request.since, "since")
    now = now_ms()
    query = select(WebhookDelivery.id).where(
        WebhookDelivery.status == request.status,
        WebhookDelivery.created_at >= since,
        or_(WebhookDelivery.lease_expires_at.is_(None), WebhookDelivery.lease_expires_at < now),
        ~WebhookDelivery.event_type.like("%.task.processing"),
    )
    if account_id is not None:
        query = query.where(WebhookDelivery.account_id == account_id)
    if request.destination:
        query = query.where(WebhookDelivery.destination == destination_of(request.destination))
    query = query.order_by(WebhookDelivery.created_at, WebhookDelivery.id)
    async with db.write() as session:
        ids = list((await session.scalars(query.limit(request.limit + 1))).all())
        more = len(ids) > request.limit
        ids = ids[: request.limit]
        redelivered = await rearm_deliveries(session, ids, request.status, now)
        if redelivered:
            await wake_dispatchers(session)
    return BulkRedeliveryResult(redelivered=len(redelivered), ids=sorted(redelivered), more=more)
