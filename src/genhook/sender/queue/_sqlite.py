"""The SQLite adapter of the delivery queue: the claim and record transaction as JSON-array
statements on the queue's own ``sqlite3`` connection, in its own thread."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from genhook.db import Database
from genhook.db.sqlite import open_sqlite
from genhook.sender.fairness import Rooms, Stop
from genhook.sender.queue._port import (
    NEXT_DUE,
    SCAN_FACTOR,
    UNLIMITED,
    Outcome,
    Outgoing,
    Ticked,
    needs_next_due,
)
from genhook.statuses import DeliveryStatus

log = logging.getLogger("genhook.sender.queue")

# Each statement handles the whole batch in one step over a JSON array parameter: the
# sqlite3 module releases the GIL around every step, and a thread that must take the GIL
# back once per row from a busy event loop spends longer waiting than working.
#
# Attempts are written first, while the delivery rows still show the lease the attempts
# were sent under. ``+`` keeps the planner off the status index for these conditions, so
# each outcome is one primary-key lookup rather than a walk over every pending row.
ATTEMPTS = f"""
INSERT INTO webhook_attempts
       (delivery_id, number, started_at, duration_ms, status_code, error,
        response_excerpt, kid)
SELECT o.value ->> 0, o.value ->> 1, o.value ->> 2, o.value ->> 3, o.value ->> 4,
       o.value ->> 5, o.value ->> 6, o.value ->> 7
  FROM json_each(:outcomes) AS o
  JOIN webhook_deliveries AS d ON d.id = o.value ->> 0
 WHERE +d.lease_owner = :owner AND +d.status = '{DeliveryStatus.PENDING}'
"""

STATES = f"""
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
CLAIM = f"""
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
CLAIMED = f"""
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
POSTPONE = f"""
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
STOP = f"""
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
RETURN = f"""
UPDATE webhook_deliveries
   SET lease_owner = NULL, lease_expires_at = NULL,
       next_attempt_at = max(o.value ->> 1, :now), updated_at = :now
  FROM json_each(:returned) AS o
 WHERE webhook_deliveries.id = o.value ->> 0
   AND +webhook_deliveries.lease_owner = :owner
   AND +webhook_deliveries.status = '{DeliveryStatus.PENDING}'
"""
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
                recorded = connection.execute(ATTEMPTS, params).rowcount
                connection.execute(STATES, params)
                if recorded < count:
                    log.info("%d outcomes discarded: their leases were lost", count - recorded)
            if returned is not None:
                params = {"returned": returned, "owner": owner, "now": now}
                connection.execute(RETURN, params)
            if stops is not None:
                connection.execute(STOP, {"stops": stops, "now": now})
            if rooms.postpone:
                params = {"postpone": json.dumps(rooms.postpone), "now": now}
                connection.execute(POSTPONE, params)
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
                if connection.execute(CLAIM, params).rowcount:
                    (rows,) = connection.execute(CLAIMED, params).fetchone()
                    claimed = [claimed_from_json(row) for row in json.loads(rows)]
            ticked = Ticked(claimed)
            if needs_next_due(count, returned is not None, limit, len(claimed)):
                (ticked.next_due,) = connection.execute(NEXT_DUE).fetchone()
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


def claimed_from_json(row: list[Any]) -> Outgoing:
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
