"""Endpoint and host health as the API shows it: each worker's circuit changes, persisted.

Delivery workers keep their circuit breakers in memory (``genhook.sender.fairness``) and
write every change here, off the send path, so ``GET /api/v1/webhooks/destinations`` shows
what the workers see. Every row belongs to one account: an account is shown its own
endpoints' and hosts' state only, never what another account's deliveries met on the same
host; operators list every account's. With several workers the newest change wins.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from pydantic import BaseModel, Field
from sqlalchemy import ColumnElement, case, func, or_, select

from genhook.db import Database, WebhookDelivery, WebhookDestination, now_ms
from genhook.sender.fairness import Transition
from genhook.sender.queue import defer_circuit
from genhook.statuses import DeliveryStatus
from genhook.times import iso_ms

# Destinations with a delivery this recent (or one still pending) are listed.
WINDOW_MS = 24 * 3600 * 1000
MAX_DESTINATIONS = 500


async def record_transitions(db: Database, transitions: Sequence[Transition]) -> None:
    """Persist circuit changes. A circuit that opened also moves its endpoint's (or host's)
    due, unclaimed deliveries of that account to the probe time: none of them would be
    claimed before it, and claims then need not look past them. No attempt is counted."""
    latest: dict[tuple[str, str], Transition] = {}
    for transition in transitions:
        latest[transition.account, transition.target] = transition
    async with db.write() as session:
        for t in latest.values():
            if t.state == "open" and t.retry_at is not None:
                await defer_circuit(session, t.account, t.scope, t.target, t.retry_at, t.at)
        for t in latest.values():
            row = await session.get(WebhookDestination, (t.account, t.target))
            if row is None:
                row = WebhookDestination(account_id=t.account, target=t.target)
                session.add(row)
            elif row.updated_at > t.at:
                continue  # another worker saw something newer
            row.scope = t.scope
            row.state = t.state
            row.consecutive_failures = t.consecutive_failures
            row.opened_at = t.opened_at
            row.retry_at = t.retry_at
            row.last_error = t.last_error
            row.updated_at = t.at


class Health(BaseModel):
    state: str = Field(description="closed (healthy), open (backed off) or half_open (probing).")
    consecutive_failures: int
    opened_at: str | None = Field(description="When the circuit last opened.")
    retry_at: str | None = Field(description="While open: when the next probe may go.")
    last_error: str | None


class EndpointView(Health):
    endpoint: str = Field(description="The webhook URL without its query.")
    pending: int = Field(description="Deliveries waiting for this endpoint.")
    delivered: int = Field(description="Delivered in the last 24 hours.")
    undeliverable: int = Field(description="Given up in the last 24 hours.")


class DestinationView(Health):
    """A host and its circuit for connection failures, with the account's endpoints on it."""

    destination: str = Field(description="scheme://host:port of the webhook URLs.")
    account_id: str = Field(description="The account these deliveries and circuits are of.")
    pending: int = Field(description="Deliveries waiting for this destination.")
    delivered: int = Field(description="Delivered in the last 24 hours.")
    undeliverable: int = Field(description="Given up in the last 24 hours.")
    endpoints: list[EndpointView] = Field(
        description="Each endpoint on this host, with its circuit for HTTP-level failures."
    )


class DestinationList(BaseModel):
    data: list[DestinationView]


_CLOSED = Health(
    state="closed", consecutive_failures=0, opened_at=None, retry_at=None, last_error=None
)


def _health(row: WebhookDestination | None) -> Health:
    if row is None:
        return _CLOSED
    return Health(
        state=row.state,
        consecutive_failures=row.consecutive_failures,
        opened_at=iso_ms(row.opened_at) if row.opened_at else None,
        retry_at=iso_ms(row.retry_at) if row.retry_at else None,
        last_error=row.last_error,
    )


async def list_destinations(db: Database, *, account_id: str | None) -> DestinationList:
    """The hosts and endpoints an account's recent or pending deliveries go to, with their
    health; every account's (one entry per account and host) when ``account_id`` is None."""
    since = now_ms() - WINDOW_MS
    host = func.coalesce(WebhookDelivery.destination, WebhookDelivery.url)
    endpoint = func.coalesce(WebhookDelivery.endpoint, WebhookDelivery.url)

    def count(status: DeliveryStatus) -> ColumnElement[int]:
        return func.sum(case((WebhookDelivery.status == status, 1), else_=0))

    query = select(
        WebhookDelivery.account_id,
        host,
        endpoint,
        count(DeliveryStatus.PENDING),
        count(DeliveryStatus.DELIVERED),
        count(DeliveryStatus.UNDELIVERABLE),
    ).where(
        or_(WebhookDelivery.status == DeliveryStatus.PENDING, WebhookDelivery.created_at >= since)
    )
    health_query = select(WebhookDestination)
    if account_id is not None:
        query = query.where(WebhookDelivery.account_id == account_id)
        health_query = health_query.where(WebhookDestination.account_id == account_id)
    query = (
        query.group_by(WebhookDelivery.account_id, host, endpoint)
        .order_by(WebhookDelivery.account_id, host, endpoint)
        .limit(MAX_DESTINATIONS)
    )
    async with db.read() as session:
        rows = (await session.execute(query)).all()
        accounts = {row[0] for row in rows}
        health = {
            (h.account_id, h.target): h
            for h in (
                await session.scalars(
                    health_query.where(WebhookDestination.account_id.in_(accounts))
                )
            ).all()
        }
    grouped: dict[tuple[str, str], list[EndpointView]] = defaultdict(list)
    for account, name, path, pending, delivered, undeliverable in rows:
        grouped[account, name].append(
            EndpointView(
                endpoint=path,
                pending=int(pending or 0),
                delivered=int(delivered or 0),
                undeliverable=int(undeliverable or 0),
                **_health(health.get((account, path))).model_dump(),
            )
        )
    views = [
        DestinationView(
            destination=name,
            account_id=account,
            pending=sum(e.pending for e in endpoints),
            delivered=sum(e.delivered for e in endpoints),
            undeliverable=sum(e.undeliverable for e in endpoints),
            endpoints=endpoints,
            **_health(health.get((account, name))).model_dump(),
        )
        for (account, name), endpoints in grouped.items()
    ]
    return DestinationList(data=views)
