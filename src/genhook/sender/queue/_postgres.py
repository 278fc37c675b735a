"""The PostgreSQL adapter of the delivery queue: the claim and record transaction as
hand-written statements on the pooled ``asyncpg`` connection."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from genhook.db import Database
from genhook.db.driver import PostgresTx
from genhook.sender.fairness import Rooms, Stop
from genhook.sender.queue._port import (
    NEXT_DUE,
    SCAN_FACTOR,
    UNLIMITED,
    Outcome,
    Outgoing,
    Ticked,
    held_by,
    needs_next_due,
)
from genhook.statuses import DeliveryStatus

# transaction changed meanwhile is re-checked against the locking level's conditions. The
# windows are as on SQLite (FOR UPDATE cannot share a level with them).
CLAIM = f"""
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

POSTPONE = f"""
UPDATE webhook_deliveries
   SET next_attempt_at = $2::bigint + $3::bigint, updated_at = $2::bigint
 WHERE account_id || ' ' || endpoint = $1 AND status = '{DeliveryStatus.PENDING}'
   AND next_attempt_at <= $2::bigint AND lease_owner IS NULL
"""

STOP = f"""
UPDATE webhook_deliveries
   SET status = '{DeliveryStatus.UNDELIVERABLE}', next_attempt_at = NULL, last_error = $3,
       updated_at = $4
 WHERE account_id = $1 AND endpoint = $2 AND status = '{DeliveryStatus.PENDING}'
   AND lease_owner IS NULL
"""

RETURN = f"""
UPDATE webhook_deliveries
   SET lease_owner = NULL, lease_expires_at = NULL,
       next_attempt_at = greatest($2::bigint, $3::bigint), updated_at = $3::bigint
 WHERE id = $1 AND lease_owner = $4 AND status = '{DeliveryStatus.PENDING}'
"""

HELD = """
SELECT id, lease_owner, status FROM webhook_deliveries WHERE id = ANY($1::varchar[])
   FOR UPDATE
"""

RECORD = """
UPDATE webhook_deliveries
   SET status = $1, attempts = $2, next_attempt_at = $3,
       delivered_at = coalesce($4, delivered_at),
       lease_owner = NULL, lease_expires_at = NULL,
       last_status_code = $5, last_error = $6, last_attempt_at = $7, updated_at = $8
 WHERE id = $9
"""

ATTEMPT = """
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
                mine = held_by(owner, ids, await pg.fetch(HELD, ids))
                kept = [r for r in records if r.delivery_id in mine]
                if kept:
                    await pg.executemany(RECORD, [r.state_row(now) for r in kept])
                    await pg.executemany(ATTEMPT, [r.attempt_row() for r in kept])
            if returned:
                await pg.executemany(RETURN, [(d, due, now, owner) for d, due in returned])
            if stops:
                await pg.executemany(STOP, [(*stop, now) for stop in stops])
            if rooms.postpone:
                await pg.executemany(POSTPONE, [(d, now, ms) for d, ms in rooms.postpone.items()])
            claimed = []
            if limit:
                claimed = await self._claim(tx, owner, now, lease_expires_at, limit, rooms)
            ticked = Ticked(claimed)
            if needs_next_due(len(records), bool(returned), limit, len(claimed)):
                ticked.next_due = await pg.fetchval(NEXT_DUE)
                ticked.next_due_read = True
            return ticked

    async def _claim(
        self, tx: PostgresTx, owner: str, now: int, lease_expires_at: int, limit: int, rooms: Rooms
    ) -> list[Outgoing]:
        rows = await tx.fetch(
            CLAIM,
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
