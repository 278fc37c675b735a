"""The delivery queue: the dispatcher's two hot statements, claim and record, per backend.

The dispatcher pays one write transaction per batch: it records the attempts that ended and
claims the next due deliveries together. This port keeps that transaction in hand-written
SQL on the driver connection (``sqlite3`` or ``asyncpg``), one adapter per backend, because
building and processing the same statements through the SQL toolkit for every batch cost
more than the database's own work. Everything else about deliveries stays in the ORM.

The same transaction tells when the next pending delivery falls due, whenever the dispatcher
will want to know (it recorded outcomes, gave rows back or came back short of its limit), so
a dispatcher at a few deliveries a second needs no read transaction of its own per delivery.

A claim moves ``next_attempt_at`` to the lease expiry, so a delivery whose sender died is
simply due again when the lease runs out. An attempt is recorded only while its lease is
still held; a lease is lost only if it expired (a stalled process) and another sender
claimed the delivery, whose attempt it then is.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import sqlite3
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol, TypeVar, cast

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
from genhook.db.driver import PostgresTx, Tx, bound_insert
from genhook.db.sqlite import open_sqlite
from genhook.sender.fairness import Rooms, Route, Stop, destination_of, endpoint_of
from genhook.statuses import DeliveryStatus

# A claim looks at this many due rows per row it may take (lanes without room excluded
# first), so its cost follows the claim's size, not the backlog's.
SCAN_FACTOR = 4
# A claim without shares (tests, tools): every lane has room for the whole batch.
UNLIMITED = Rooms({}, {}, 1 << 30, 1 << 30)

log = logging.getLogger(__name__)


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


def delivery_queue(db: Database) -> DeliveryQueue:
    if db.is_sqlite:
        return SQLiteDeliveryQueue(db)
    return PostgresDeliveryQueue(db)


def _held_by(owner: str, ids: Sequence[str], held: Sequence[Sequence[Any]]) -> set[str]:
    """The ids whose lease is still ``owner``'s, from (id, lease_owner, status) rows."""
    mine = {row[0] for row in held if row[1] == owner and row[2] == DeliveryStatus.PENDING}
    for delivery_id in ids:
        if delivery_id not in mine:
            log.info("lease on %s was lost; outcome discarded", delivery_id)
    return mine


# -- SQLite -------------------------------------------------------------------------------

# Each statement handles the whole batch in one step over a JSON array parameter: the
# sqlite3 module releases the GIL around every step, and a thread that must take the GIL
# back once per row from a busy event loop spends longer waiting than working.
#
# Attempts are written first, while the delivery rows still show the lease the attempts
# were sent under. ``+`` keeps the planner off the status index for these conditions, so
# each outcome is one primary-key lookup rather than a walk over every pending row.
_SQLITE_ATTEMPTS = f"""
INSERT INTO webhook_attempts
       (delivery_id, number, started_at, duration_ms, status_code, error,
        response_excerpt, kid)
SELECT o.value ->> 0, o.value ->> 1, o.value ->> 2, o.value ->> 3, o.value ->> 4,
       o.value ->> 5, o.value ->> 6, o.value ->> 7
  FROM json_each(:outcomes) AS o
  JOIN webhook_deliveries AS d ON d.id = o.value ->> 0
 WHERE +d.lease_owner = :owner AND +d.status = '{DeliveryStatus.PENDING}'
"""

_SQLITE_STATES = f"""
UPDATE webhook_deliveries
   SET status = o.value ->> 8, attempts = o.value ->> 1, next_attempt_at = o.value ->> 9,
       delivered_at = coalesce(o.value ->> 10, delivered_at),
       lease_owner = NULL, lease_expires_at = NULL,
       last_status_code = o.value ->> 4, last_error = o.value ->> 5,
       last_attempt_at = o.value ->> 2, updated_at = :now
  FROM json_each(:outcomes) AS o
 WHERE webhook_deliveries.id = o.value ->> 0
   AND +webhook_deliveries.lease_owner = :owner
   AND +webhook_deliveries.status = '{DeliveryStatus.PENDING}'
"""

# The due rows are chosen by the subquery alone: repeating its conditions in the outer
# WHERE clause would let the planner walk every due row for each claim. One writer at a
# time makes it atomic. The windows number each destination's and each account's due rows
# so that a claim takes no more than their rooms (fairness.Rooms); a delivery whose task has
# another event in flight waits for it, and a progress event is never sent once its task's
# terminal event exists (genhook.sender.events). The rooms are materialized once per claim
# (SQLite indexes them itself): looked up with a correlated json_each, each candidate row
# parsed both JSON values twice, about 40% of the statement's time.
_SQLITE_CLAIM = f"""
WITH rooms_d(lane, room) AS MATERIALIZED (
  SELECT key, value FROM json_each(:destination_rooms)),
rooms_a(account, room) AS MATERIALIZED (
  SELECT key, value FROM json_each(:account_rooms)),
candidates AS (
  SELECT d.id, d.next_attempt_at, d.account_id || ' ' || coalesce(d.endpoint, d.url) AS lane_d,
         d.account_id,
         coalesce(rd.room, :destination_default) AS room_d,
         coalesce(ra.room, :account_default) AS room_a
    FROM webhook_deliveries AS d
    LEFT JOIN rooms_d AS rd ON rd.lane = d.account_id || ' ' || coalesce(d.endpoint, d.url)
    LEFT JOIN rooms_a AS ra ON ra.account = d.account_id
   WHERE d.status = '{DeliveryStatus.PENDING}' AND d.next_attempt_at <= :now
     AND coalesce(rd.room, :destination_default) > 0
     AND coalesce(ra.room, :account_default) > 0
     AND NOT EXISTS (SELECT 1 FROM webhook_deliveries AS s
                      WHERE s.task_id = d.task_id AND s.id <> d.id
                        AND s.lease_expires_at > :now)
     AND NOT (d.event_type LIKE '%.task.processing'
              AND EXISTS (SELECT 1 FROM webhook_deliveries AS t
                           WHERE t.task_id = d.task_id AND t.event_type LIKE '%.task.terminal'))
   ORDER BY d.next_attempt_at
   LIMIT :scan)
UPDATE webhook_deliveries
   SET lease_owner = :owner, lease_expires_at = :expires, next_attempt_at = :expires,
       updated_at = :now
 WHERE id IN (
   SELECT id FROM (
     SELECT id, next_attempt_at, room_d, room_a,
            row_number() OVER (PARTITION BY lane_d ORDER BY next_attempt_at) AS nd,
            row_number() OVER (PARTITION BY account_id ORDER BY next_attempt_at) AS na
       FROM candidates)
    WHERE nd <= room_d AND na <= room_a
    ORDER BY next_attempt_at
    LIMIT :limit)
"""

# The rows just claimed, as one JSON value (one step; the body as hex, byte for byte):
# ``:expires`` is unique to this claim among this owner's leases.
_SQLITE_CLAIMED = f"""
SELECT json_group_array(json_array(
           d.id, d.task_id, d.account_id, d.url, d.event_type, hex(d.body), d.attempts,
           d.round_start, a.signing_secret, d.destination, a.standard_webhooks,
           d.created_at, d.endpoint, d.trace_context))
  FROM webhook_deliveries AS d LEFT JOIN accounts AS a ON a.id = d.account_id
 WHERE d.status = '{DeliveryStatus.PENDING}' AND d.next_attempt_at = :expires
   AND d.lease_owner = :owner
"""

# A slow endpoint's backlog, postponed while it has no room (fairness.Rooms.postpone); the
# key is the lane, ``account endpoint``.
_SQLITE_POSTPONE = f"""
UPDATE webhook_deliveries
   SET next_attempt_at = :now + o.value, updated_at = :now
  FROM json_each(:postpone) AS o
 WHERE webhook_deliveries.account_id || ' ' || webhook_deliveries.endpoint = o.key
   AND webhook_deliveries.status = '{DeliveryStatus.PENDING}'
   AND webhook_deliveries.next_attempt_at <= :now
   AND webhook_deliveries.lease_owner IS NULL
"""

# An endpoint answered 410 Gone: its pending deliveries not in flight stop, with the reason
# (after this tick's returned rows are free again, so those stop too).
_SQLITE_STOP = f"""
UPDATE webhook_deliveries
   SET status = '{DeliveryStatus.UNDELIVERABLE}', next_attempt_at = NULL,
       last_error = o.value ->> 2, updated_at = :now
  FROM json_each(:stops) AS o
 WHERE webhook_deliveries.account_id = o.value ->> 0
   AND webhook_deliveries.endpoint = o.value ->> 1
   AND webhook_deliveries.status = '{DeliveryStatus.PENDING}'
   AND webhook_deliveries.lease_owner IS NULL
"""

# Held deliveries given back unsent (their destination's circuit opened): due again at the
# given time, no attempt counted.
_SQLITE_RETURN = f"""
UPDATE webhook_deliveries
   SET lease_owner = NULL, lease_expires_at = NULL,
       next_attempt_at = max(o.value ->> 1, :now), updated_at = :now
  FROM json_each(:returned) AS o
 WHERE webhook_deliveries.id = o.value ->> 0
   AND +webhook_deliveries.lease_owner = :owner
   AND +webhook_deliveries.status = '{DeliveryStatus.PENDING}'
"""

# When the earliest pending delivery falls due (ix_deliveries_status_next: one index seek).
_NEXT_DUE = (
    f"SELECT min(next_attempt_at) FROM webhook_deliveries WHERE status = '{DeliveryStatus.PENDING}'"
)
_NEXT_DUE_READ = text(_NEXT_DUE)

# ->> and UPDATE ... FROM.
SQLITE_MINIMUM = (3, 38, 0)


class SQLiteDeliveryQueue:
    """The transaction runs on the queue's own connection, in its own thread.

    SQLite releases the GIL while it works, so there the statements overlap with the event
    loop's sending instead of adding to it; one hand-over per batch costs little. The
    process's write turn (``Database.write_turn``) is held meanwhile, so a writer on the
    loop never waits inside SQLite for it, and a lock held by another process is waited for
    in this thread, through busy_timeout, not on the loop.
    """

    claims_alone = False  # in process: the outcomes cost the claim little

    def __init__(self, db: Database) -> None:
        if not db.sqlite_path or db.sqlite_path == ":memory:":
            raise ValueError("the SQLite delivery queue needs a database file")
        if sqlite3.sqlite_version_info < SQLITE_MINIMUM:
            raise RuntimeError(
                f"webhook delivery needs SQLite {'.'.join(map(str, SQLITE_MINIMUM))} or "
                f"newer; this Python has {sqlite3.sqlite_version}"
            )
        self.db = db
        self._path = db.sqlite_path
        self._connection: sqlite3.Connection | None = None
        self._thread: ThreadPoolExecutor | None = None
        self._last_expires = 0

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
        # Strictly increasing, so a claim's rows are exactly those leased to this owner
        # until this instant.
        expires = self._last_expires = max(lease_expires_at, self._last_expires + 1)
        outcomes = json.dumps([r.json_row() for r in records]) if records else None
        back = json.dumps(list(returned)) if returned else None
        stopped = json.dumps(list(stops)) if stops else None
        work = partial(
            self._tick, outcomes, len(records), owner, now, expires, limit, rooms, back, stopped
        )
        if inline:
            # Nothing to overlap with: the hop to the thread and back would be all the gain.
            async with self.db.write_turn():
                return work()
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="webhook-queue")
        loop = asyncio.get_running_loop()
        async with self.db.write_turn():
            future = loop.run_in_executor(self._thread, work)
            try:
                return await asyncio.shield(future)
            except asyncio.CancelledError:
                # Keep the write turn until the transaction has ended either way.
                await asyncio.wait({future})
                raise

    def _tick(
        self,
        outcomes: str | None,
        count: int,
        owner: str,
        now: int,
        expires: int,
        limit: int,
        rooms: Rooms,
        returned: str | None,
        stops: str | None,
    ) -> Ticked:
        if self._connection is None:
            self._connection = open_sqlite(self._path)
        connection = self._connection
        connection.execute("BEGIN IMMEDIATE")
        try:
            if outcomes is not None:
                params = {"outcomes": outcomes, "owner": owner, "now": now}
                recorded = connection.execute(_SQLITE_ATTEMPTS, params).rowcount
                connection.execute(_SQLITE_STATES, params)
                if recorded < count:
                    log.info("%d outcomes discarded: their leases were lost", count - recorded)
            if returned is not None:
                params = {"returned": returned, "owner": owner, "now": now}
                connection.execute(_SQLITE_RETURN, params)
            if stops is not None:
                connection.execute(_SQLITE_STOP, {"stops": stops, "now": now})
            if rooms.postpone:
                params = {"postpone": json.dumps(rooms.postpone), "now": now}
                connection.execute(_SQLITE_POSTPONE, params)
            claimed: list[Outgoing] = []
            if limit:
                params = {
                    "owner": owner,
                    "expires": expires,
                    "now": now,
                    "limit": limit,
                    "scan": limit * SCAN_FACTOR,
                    "destination_rooms": json.dumps(rooms.destinations),
                    "account_rooms": json.dumps(rooms.accounts),
                    "destination_default": rooms.destination_default,
                    "account_default": rooms.account_default,
                }
                if connection.execute(_SQLITE_CLAIM, params).rowcount:
                    (rows,) = connection.execute(_SQLITE_CLAIMED, params).fetchone()
                    claimed = [_claimed_from_json(row) for row in json.loads(rows)]
            ticked = Ticked(claimed)
            if needs_next_due(count, returned is not None, limit, len(claimed)):
                (ticked.next_due,) = connection.execute(_NEXT_DUE).fetchone()
                ticked.next_due_read = True
            connection.execute("COMMIT")
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
        return ticked

    async def close(self) -> None:
        """Close the connection in its thread and end the thread; a later tick reopens."""
        thread, self._thread = self._thread, None
        if thread is None:
            return

        def close() -> None:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

        await asyncio.get_running_loop().run_in_executor(thread, close)
        thread.shutdown(wait=True)


def _claimed_from_json(row: list[Any]) -> Outgoing:
    (
        delivery_id,
        task_id,
        account_id,
        url,
        event_type,
        body,
        attempts,
        round_start,
        secret,
        destination,
        standard,
        created_at,
        endpoint,
        trace_context,
    ) = row
    return Outgoing(
        delivery_id,
        task_id,
        account_id,
        url,
        event_type,
        bytes.fromhex(body),
        attempts,
        round_start,
        secret,
        destination or "",
        None if standard is None else bool(standard),
        created_at,
        endpoint or "",
        trace_context,
    )


# -- PostgreSQL ---------------------------------------------------------------------------

# FOR UPDATE SKIP LOCKED lets concurrent dispatchers claim disjoint rows; a row another
# transaction changed meanwhile is re-checked against the locking level's conditions. The
# windows are as on SQLite (FOR UPDATE cannot share a level with them).
_PG_CLAIM = f"""
UPDATE webhook_deliveries
   SET lease_owner = $1, lease_expires_at = $2, next_attempt_at = $2, updated_at = $3
 WHERE id IN (
   SELECT w.id FROM webhook_deliveries AS w
    WHERE w.status = '{DeliveryStatus.PENDING}' AND w.next_attempt_at <= $3
      AND w.id IN (
        SELECT c.id FROM (
          SELECT id, next_attempt_at, room_d, room_a,
                 row_number() OVER (PARTITION BY lane_d ORDER BY next_attempt_at) AS nd,
                 row_number() OVER (PARTITION BY account_id ORDER BY next_attempt_at) AS na
            FROM (
              SELECT d.id, d.next_attempt_at, d.account_id,
                     d.account_id || ' ' || coalesce(d.endpoint, d.url) AS lane_d,
                     coalesce(($5::jsonb ->> (d.account_id || ' ' || coalesce(d.endpoint, d.url)))
                              ::int, $6) AS room_d,
                     coalesce(($7::jsonb ->> d.account_id)::int, $8) AS room_a
                FROM webhook_deliveries AS d
               WHERE d.status = '{DeliveryStatus.PENDING}' AND d.next_attempt_at <= $3
                 AND coalesce(($5::jsonb ->> (d.account_id || ' ' || coalesce(d.endpoint, d.url)))
                              ::int, $6) > 0
                 AND coalesce(($7::jsonb ->> d.account_id)::int, $8) > 0
                 AND NOT EXISTS (SELECT 1 FROM webhook_deliveries AS s
                                  WHERE s.task_id = d.task_id AND s.id <> d.id
                                    AND s.lease_expires_at > $3)
                 AND NOT (d.event_type LIKE '%.task.processing'
                          AND EXISTS (SELECT 1 FROM webhook_deliveries AS t
                                       WHERE t.task_id = d.task_id
                                         AND t.event_type LIKE '%.task.terminal'))
               ORDER BY d.next_attempt_at
               LIMIT $9) AS candidates) AS c
         WHERE c.nd <= c.room_d AND c.na <= c.room_a
         ORDER BY c.next_attempt_at
         LIMIT $4)
    ORDER BY w.next_attempt_at
    FOR UPDATE SKIP LOCKED)
RETURNING id, task_id, account_id, url, event_type, body, attempts, round_start,
          (SELECT signing_secret FROM accounts
            WHERE accounts.id = webhook_deliveries.account_id),
          destination,
          (SELECT standard_webhooks FROM accounts
            WHERE accounts.id = webhook_deliveries.account_id),
          created_at, endpoint, trace_context
"""

_PG_POSTPONE = f"""
UPDATE webhook_deliveries
   SET next_attempt_at = $2::bigint + $3::bigint, updated_at = $2::bigint
 WHERE account_id || ' ' || endpoint = $1 AND status = '{DeliveryStatus.PENDING}'
   AND next_attempt_at <= $2::bigint AND lease_owner IS NULL
"""

_PG_STOP = f"""
UPDATE webhook_deliveries
   SET status = '{DeliveryStatus.UNDELIVERABLE}', next_attempt_at = NULL, last_error = $3,
       updated_at = $4
 WHERE account_id = $1 AND endpoint = $2 AND status = '{DeliveryStatus.PENDING}'
   AND lease_owner IS NULL
"""

_PG_RETURN = f"""
UPDATE webhook_deliveries
   SET lease_owner = NULL, lease_expires_at = NULL,
       next_attempt_at = greatest($2::bigint, $3::bigint), updated_at = $3::bigint
 WHERE id = $1 AND lease_owner = $4 AND status = '{DeliveryStatus.PENDING}'
"""

_PG_HELD = """
SELECT id, lease_owner, status FROM webhook_deliveries WHERE id = ANY($1::varchar[])
   FOR UPDATE
"""

_PG_RECORD = """
UPDATE webhook_deliveries
   SET status = $1, attempts = $2, next_attempt_at = $3,
       delivered_at = coalesce($4, delivered_at),
       lease_owner = NULL, lease_expires_at = NULL,
       last_status_code = $5, last_error = $6, last_attempt_at = $7, updated_at = $8
 WHERE id = $9
"""

_PG_ATTEMPT = """
INSERT INTO webhook_attempts
       (delivery_id, number, started_at, duration_ms, status_code, error,
        response_excerpt, kid)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
"""


class PostgresDeliveryQueue:
    """Its own transaction on the pooled asyncpg connection.

    Each statement is a round trip to the server, and the transaction that records outcomes
    and claims is six or seven of them. An idle dispatcher woken for new work therefore
    claims alone (``claims_alone``): the claim is one statement, sent outside a transaction,
    one round trip; the outcomes and the next due time come with a later exchange.
    """

    claims_alone = True

    def __init__(self, db: Database) -> None:
        self.db = db

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
        if inline and limit and not (records or returned or stops or rooms.postpone):
            async with self.db.postgres_transaction(atomic=False) as tx:
                return Ticked(await self._claim(tx, owner, now, lease_expires_at, limit, rooms))
        async with self.db.postgres_transaction() as tx:
            # Hand-written SQL on the asyncpg connection itself; the transaction around it
            # lets go of a connection the server dropped, and raises that as a disconnect.
            pg: Any = tx.connection
            if records:
                ids = [r.delivery_id for r in records]
                mine = _held_by(owner, ids, await pg.fetch(_PG_HELD, ids))
                kept = [r for r in records if r.delivery_id in mine]
                if kept:
                    await pg.executemany(_PG_RECORD, [r.state_row(now) for r in kept])
                    await pg.executemany(_PG_ATTEMPT, [r.attempt_row() for r in kept])
            if returned:
                await pg.executemany(_PG_RETURN, [(d, due, now, owner) for d, due in returned])
            if stops:
                await pg.executemany(_PG_STOP, [(*stop, now) for stop in stops])
            if rooms.postpone:
                await pg.executemany(
                    _PG_POSTPONE, [(d, now, ms) for d, ms in rooms.postpone.items()]
                )
            claimed = []
            if limit:
                claimed = await self._claim(tx, owner, now, lease_expires_at, limit, rooms)
            ticked = Ticked(claimed)
            if needs_next_due(len(records), bool(returned), limit, len(claimed)):
                ticked.next_due = await pg.fetchval(_NEXT_DUE)
                ticked.next_due_read = True
            return ticked

    async def _claim(
        self, tx: PostgresTx, owner: str, now: int, lease_expires_at: int, limit: int, rooms: Rooms
    ) -> list[Outgoing]:
        rows = await tx.fetch(
            _PG_CLAIM,
            owner,
            lease_expires_at,
            now,
            limit,
            json.dumps(rooms.destinations),
            rooms.destination_default,
            json.dumps(rooms.accounts),
            rooms.account_default,
            limit * SCAN_FACTOR,
        )
        # A NULL destination is filled in when the batch is signed.
        return [Outgoing(*row) for row in rows]

    async def close(self) -> None:
        """Nothing to release: each batch borrows a pooled connection."""


# The other writes of webhook_deliveries, webhook_attempts and webhook_replays: enqueue,
# give up superseded progress events, clear leases, defer behind an open circuit, rearm
# for a redelivery, prune. Each runs in its caller's transaction, so an outbox row still
# commits with its task's terminal state. The same SQL serves both backends (ORM).


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
