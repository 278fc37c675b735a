"""The delivery queue's port: what the dispatcher claims and records, and the protocol each
backend's adapter (``_sqlite``, ``_postgres``) implements."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from genhook.sender.fairness import Rooms, Route, Stop
from genhook.statuses import DeliveryStatus

# A claim looks at this many due rows per row it may take (lanes without room excluded
# first), so its cost follows the claim's size, not the backlog's.
SCAN_FACTOR = 4
# A claim without shares (tests, tools): every lane has room for the whole batch.
UNLIMITED = Rooms({}, {}, 1 << 30, 1 << 30)

log = logging.getLogger("genhook.sender.queue")


@dataclass(slots=True, eq=False)
class Outgoing:
    """A delivery on its way out. The claim fills the fields up to ``trace_context``, in the
    claim statements' order; signing fills ``headers`` and ``kid`` and drops the opened
    secret."""

    id: str
    task_id: str
    account_id: str
    url: str
    event_type: str
    body: bytes
    # Attempts so far and where the current retry budget began; unchanged while leased.
    attempts: int
    round_start: int
    secret: str | None
    # ``scheme://host:port``: the host, the unit of connection health.
    destination: str = ""
    # The account's Standard Webhooks choice; None follows the global setting.
    standard: bool | None = None
    # When the outbox row was written: a terminal event's task ended then (for metrics).
    created_at: int | None = None
    # The URL without its query: the unit of fairness and endpoint health.
    endpoint: str = ""
    # The task's traceparent when traced (``genhook.tracing``): the attempt's span parent.
    trace_context: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    kid: str = ""

    @property
    def terminal(self) -> bool:
        return self.event_type.endswith(".task.terminal")

    @property
    def route(self) -> Route:
        return Route(self.account_id, self.endpoint, self.destination)

    @property
    def terminal_at(self) -> int | None:
        """When the task ended, for a terminal event (its outbox row was written then)."""
        return self.created_at if self.terminal else None


@dataclass(slots=True, eq=False)
class Ticked:
    """What one queue transaction (``DeliveryQueue.tick``) gives back."""

    claimed: list[Outgoing]
    # Whether ``next_due`` was read: only when the caller will want it (``needs_next_due``).
    next_due_read: bool = False
    # When the earliest pending delivery falls due as the transaction ends (epoch ms; a
    # claimed one at its lease's expiry), None if none is pending.
    next_due: int | None = None


def needs_next_due(records: int, returned: bool, limit: int, claimed: int) -> bool:
    """Whether a tick reads the next due time: after it recorded outcomes (a retry may now
    be scheduled) or gave rows back, or when it claimed fewer than it asked for (nothing
    more is due now; the next look waits for the earliest scheduled one)."""
    return records > 0 or returned or (limit > 0 and claimed < limit)


@dataclass(slots=True, eq=False)
class Outcome:
    """How one attempt ended. The sender fills the fields up to ``retry_after``; recording
    it settles the state its delivery moves to (``status`` and the two times)."""

    delivery_id: str
    attempts: int
    round_start: int
    started_at: int
    duration_ms: int
    status_code: int | None
    error: str | None
    excerpt: str | None
    kid: str | None
    retry_after: float | None = None
    # Not a terminal event's attempt (a progress event's): until it is recorded, its lease
    # holds back the other events of its task.
    holds_task: bool = False
    status: str = DeliveryStatus.PENDING
    next_attempt_at: int | None = None
    delivered_at: int | None = None

    @property
    def acknowledged(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300

    @property
    def number(self) -> int:
        """This attempt's number: attempts are counted from 1 and never restart."""
        return self.attempts + 1

    def state_row(self, now: int) -> tuple[Any, ...]:
        return (
            self.status,
            self.number,
            self.next_attempt_at,
            self.delivered_at,
            self.status_code,
            self.error,
            self.started_at,
            now,
            self.delivery_id,
        )

    def json_row(self) -> list[Any]:
        """The order the SQLite statements read it in (``o.value ->> n``)."""
        return [
            self.delivery_id,
            self.number,
            self.started_at,
            self.duration_ms,
            self.status_code,
            self.error,
            self.excerpt,
            self.kid,
            self.status,
            self.next_attempt_at,
            self.delivered_at,
        ]

    def attempt_row(self) -> tuple[Any, ...]:
        return (
            self.delivery_id,
            self.number,
            self.started_at,
            self.duration_ms,
            self.status_code,
            self.error,
            self.excerpt,
            self.kid,
        )


class DeliveryQueue(Protocol):
    # Whether a claim alone is much cheaper than one that also records outcomes (see
    # ``PostgresDeliveryQueue``): then an idle dispatcher woken for new work claims alone,
    # and its outcomes wait for the next exchange.
    claims_alone: bool

    async def tick(
        self,
        records: Sequence[Outcome],
        *,
        owner: str,
        now: int,
        lease_expires_at: int,
        limit: int,
        rooms: Rooms = UNLIMITED,
        returned: Sequence[tuple[str, int]] = (),
        inline: bool = False,
        stops: Sequence[Stop] = (),
    ) -> Ticked:
        """Record ``records``, give back ``returned`` (delivery id, due at) unsent, stop the
        pending deliveries of ``stops``' endpoints, and claim up to ``limit`` due deliveries
        within ``rooms``, in one transaction; with the next due time when
        ``needs_next_due``. ``inline``: the caller's loop has nothing else to do meanwhile
        (an idle dispatcher)."""
        ...

    async def close(self) -> None: ...


def held_by(owner: str, ids: Sequence[str], held: Sequence[Sequence[Any]]) -> set[str]:
    """The ids whose lease is still ``owner``'s, from (id, lease_owner, status) rows."""
    mine = {row[0] for row in held if row[1] == owner and row[2] == DeliveryStatus.PENDING}
    for delivery_id in ids:
        if delivery_id not in mine:
            log.info("lease on %s was lost; outcome discarded", delivery_id)
    return mine


# When the earliest pending delivery falls due (ix_deliveries_status_next: one index seek);
# the same statement on both backends.
NEXT_DUE = (
    f"SELECT min(next_attempt_at) FROM webhook_deliveries WHERE status = '{DeliveryStatus.PENDING}'"
)
