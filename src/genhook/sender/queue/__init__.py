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

The package holds the port (``_port``: what is claimed and recorded, and the protocol), one
adapter per backend (``_sqlite``, ``_postgres``) and the writes both backends share through
the ORM (``_orm``). Callers import from the package only.
"""

from __future__ import annotations

from genhook.db import Database
from genhook.sender.queue._orm import (
    clear_expired_leases,
    defer_circuit,
    delete_attempts,
    delete_deliveries_of,
    earliest_pending,
    event_enqueued,
    give_up_progress,
    give_up_task_progress,
    insert_delivery,
    new_delivery_id,
    pending_delivery,
    prune_attempts,
    rearm_deliveries,
    rearm_delivery,
    release_deliveries,
    release_leases,
    without_terminal_delivery,
)
from genhook.sender.queue._port import (
    SCAN_FACTOR,
    UNLIMITED,
    DeliveryQueue,
    Outcome,
    Outgoing,
    Ticked,
    needs_next_due,
)
from genhook.sender.queue._postgres import PostgresDeliveryQueue
from genhook.sender.queue._sqlite import SQLITE_MINIMUM, SQLiteDeliveryQueue

__all__ = [
    "SCAN_FACTOR",
    "SQLITE_MINIMUM",
    "UNLIMITED",
    "DeliveryQueue",
    "Outcome",
    "Outgoing",
    "PostgresDeliveryQueue",
    "SQLiteDeliveryQueue",
    "Ticked",
    "clear_expired_leases",
    "defer_circuit",
    "delete_attempts",
    "delete_deliveries_of",
    "delivery_queue",
    "earliest_pending",
    "event_enqueued",
    "give_up_progress",
    "give_up_task_progress",
    "insert_delivery",
    "needs_next_due",
    "new_delivery_id",
    "pending_delivery",
    "prune_attempts",
    "rearm_deliveries",
    "rearm_delivery",
    "release_deliveries",
    "release_leases",
    "without_terminal_delivery",
]


def delivery_queue(db: Database) -> DeliveryQueue:
    if db.is_sqlite:
        return SQLiteDeliveryQueue(db)
    return PostgresDeliveryQueue(db)
