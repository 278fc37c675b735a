"""Destination health as the API shows it: each worker's circuit changes, persisted.

Delivery workers keep their circuit breakers in memory (``genhook.sender.fairness``) and
write every change here, off the send path, so ``GET /api/v1/webhooks/destinations`` shows
what the workers see. With several workers the newest change wins.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field
from sqlalchemy import ColumnElement, case, func, or_, select

from genhook.db import Database, WebhookDelivery, WebhookDestination, now_ms
from genhook.sender.fairness import Transition
from genhook.sender.queue import defer_destination
from genhook.tasks.views import iso_ms

# Destinations with a delivery this recent (or one still pending) are listed.
WINDOW_MS = 24 * 3600 * 1000
MAX_DESTINATIONS = 500


async def record_transitions(db: Database, transitions: Sequence[Transition]) -> None:
    """Persist circuit changes. A circuit that opened also moves its destination's due,
    unclaimed deliveries to the probe time: none of them would be claimed before it, and
    claims then need not look past them. No attempt is counted."""
    latest: dict[str, Transition] = {}
    for transition in transitions:
        latest[transition.destination] = transition
    async with db.write() as session:
        for t in latest.values():
            if t.state == "open" and t.retry_at is not None:
                await defer_destination(session, t.destination, t.retry_at, t.at)
        for t in latest.values():
            row = await session.get(WebhookDestination, t.destination)
            if row is None:
                row = WebhookDestination(destination=t.destination)
                session.add(row)
            elif row.updated_at > t.at:
                continue  # another worker saw something newer
            row.state = t.state
            row.consecutive_failures = t.consecutive_failures
            row.opened_at = t.opened_at
            row.retry_at = t.retry_at
            row.last_error = t.last_error
            row.updated_at = t.at


class DestinationView(BaseModel):
    destination: str = Field(description="scheme://host:port of the webhook URLs.")
    state: str = Field(description="closed (healthy), open (backed off) or half_open (probing).")
    consecutive_failures: int
    opened_at: str | None = Field(description="When the circuit last opened.")
    retry_at: str | None = Field(description="While open: when the next probe may go.")
    last_error: str | None
    pending: int = Field(description="This account's deliveries waiting for this destination.")
    delivered: int = Field(description="Delivered in the last 24 hours.")
    undeliverable: int = Field(description="Given up in the last 24 hours.")


class DestinationList(BaseModel):
    data: list[DestinationView]


async def list_destinations(db: Database, *, account_id: str | None) -> DestinationList:
    """The destinations an account's recent or pending deliveries go to, with health."""
    since = now_ms() - WINDOW_MS
    key = func.coalesce(WebhookDelivery.destination, WebhookDelivery.url)

    def count(status: str) -> ColumnElement[int]:
        return func.sum(case((WebhookDelivery.status == status, 1), else_=0))

    query = select(key, count("pending"), count("delivered"), count("undeliverable")).where(
        or_(WebhookDelivery.status == "pending", WebhookDelivery.created_at >= since)
    )
    if account_id is not None:
        query = query.where(WebhookDelivery.account_id == account_id)
    query = query.group_by(key).order_by(key).limit(MAX_DESTINATIONS)
    async with db.read() as session:
        rows = (await session.execute(query)).all()
        names = [row[0] for row in rows]
        health = {
            h.destination: h
            for h in (
                await session.scalars(
                    select(WebhookDestination).where(WebhookDestination.destination.in_(names))
                )
            ).all()
        }
    views = []
    for name, pending, delivered, undeliverable in rows:
        h = health.get(name)
        views.append(
            DestinationView(
                destination=name,
                state=h.state if h is not None else "closed",
                consecutive_failures=h.consecutive_failures if h is not None else 0,
                opened_at=iso_ms(h.opened_at) if h is not None and h.opened_at else None,
                retry_at=iso_ms(h.retry_at) if h is not None and h.retry_at else None,
                last_error=h.last_error if h is not None else None,
                pending=int(pending or 0),
                delivered=int(delivered or 0),
                undeliverable=int(undeliverable or 0),
            )
        )
    return DestinationList(data=views)
