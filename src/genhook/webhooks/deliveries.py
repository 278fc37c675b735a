"""The attempt log and redelivery, shared by the HTTP API and the CLI.

Attempt numbers count every attempt of a delivery, from 1, and never restart: a
redelivery continues the numbering (after attempts 1..10, the redelivered attempts are
11, 12, ...) and gives the delivery a fresh retry budget of
``webhook_retry_max_attempts`` attempts.
"""

from __future__ import annotations

from collections import defaultdict

from pydantic import BaseModel, Field
from sqlalchemy import or_, select, update

from genhook.db import Database, WebhookAttempt, WebhookDelivery, now_ms
from genhook.errors import Conflict, InvalidRequest, NotFound
from genhook.tasks.views import iso_ms
from genhook.webhooks.outbox import wake_dispatchers

DELIVERY_STATUSES = ("pending", "delivered", "undeliverable")
MAX_PAGE = 200


class AttemptView(BaseModel):
    number: int = Field(description="1-based; continues across redeliveries.")
    started_at: str = Field(description="ISO 8601 time the attempt started.")
    duration_ms: int
    status_code: int | None = Field(description="HTTP status, or null when none was received.")
    error: str | None = Field(description="Why the attempt failed; null when acknowledged.")
    response_excerpt: str | None = Field(description="The start of the receiver's response.")
    kid: str | None = Field(description="The Ed25519 key that signed the attempt.")


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


def _view(row: WebhookDelivery, log: list[WebhookAttempt]) -> DeliveryView:
    return DeliveryView(
        id=row.id,
        session_id=row.task_id,
        event_type=row.event_type,
        url=row.url,
        status=row.status,
        attempts=row.attempts,
        redeliveries=row.redeliveries,
        next_attempt_at=_iso(row.next_attempt_at) if row.status == "pending" else None,
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
    if status is not None and status not in DELIVERY_STATUSES:
        raise InvalidRequest(f"status must be one of {', '.join(DELIVERY_STATUSES)}")
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
            raise InvalidRequest("before is not a cursor returned by this endpoint")
        query = query.where(
            or_(
                WebhookDelivery.created_at < int(created),
                (WebhookDelivery.created_at == int(created)) & (WebhookDelivery.id < last_id),
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
    cursor = f"{rows[-1].created_at}:{rows[-1].id}" if more and rows else None
    return DeliveryPage(data=[_view(r, logs[r.id]) for r in rows], next_before=cursor)


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
    return _view(row, list(log))


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
        result = await session.execute(
            update(WebhookDelivery)
            .where(
                WebhookDelivery.id == delivery_id,
                or_(
                    WebhookDelivery.lease_expires_at.is_(None),
                    WebhookDelivery.lease_expires_at < now,
                ),
            )
            .values(
                status="pending",
                round_start=WebhookDelivery.attempts,
                redeliveries=WebhookDelivery.redeliveries + 1,
                next_attempt_at=now,
                lease_owner=None,
                lease_expires_at=None,
                updated_at=now,
            )
            .execution_options(synchronize_session=False)
        )
        if not result.rowcount:  # type: ignore[attr-defined]
            raise Conflict(f"webhook delivery {delivery_id} has an attempt in flight; retry later")
    wake_dispatchers()
    return await get_delivery(db, delivery_id, account_id=account_id)
