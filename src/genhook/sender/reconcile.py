"""The reconciliation safety net: a missed fast path still delivers within about 30 minutes.

Every ``webhook_reconcile_interval_seconds`` it finds terminal tasks with a
``webhook_url`` but no delivery (enqueuing them), deliveries whose lease expired
mid-flight (clearing the lease; they are already due again), due deliveries nobody has
picked up (waking the dispatcher), and rotated signing keys past their overlap. Every
query is bounded by an index on a time column, so a pass costs in proportion to the rows
it finds, not to the size of the tables.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sqlalchemy import and_, func, select

from genhook.config import Settings
from genhook.db import Database, WebhookDelivery, now_ms
from genhook.sender.events import stale_progress_exists, supersede_stale_progress
from genhook.sender.keys import retire_expired_keys
from genhook.sender.queue import clear_expired_leases
from genhook.statuses import DeliveryStatus

log = logging.getLogger(__name__)

# The first pass looks this far back for terminal tasks missing a delivery; later passes
# start where the previous one ended, less ``OVERLAP_MS`` for transactions that committed
# late. The outbox makes missing deliveries rare, so the window stays small.
INITIAL_LOOKBACK_MS = 86_400_000
OVERLAP_MS = 2 * 60_000
# A due delivery this late is reported as missed by the fast path.
OVERDUE_MS = 60_000
BATCH = 500  # overdue deliveries counted at most


@dataclass
class PassReport:
    enqueued: int = 0
    expired_leases: int = 0
    overdue: int = 0
    retired_keys: int = 0


# Publishes the terminal events of tasks that ended between ``since`` and ``now`` without one;
# returns how many, and where the next pass resumes (None: from ``now`` less the overlap).
# The task domain supplies it (``Lifecycle.enqueue_missing``, wired in ``genhook.wiring``).
MissingEvents = Callable[[int, int], Awaitable[tuple[int, int | None]]]


class Reconciler:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        *,
        wake: Callable[[], None] | None = None,
        missing: MissingEvents | None = None,
    ) -> None:
        self.settings = settings
        self.db = db
        self.wake = wake
        self.missing = missing
        self.since: int | None = None

    async def run_once(self, *, now: int | None = None) -> PassReport:
        moment = now if now is not None else now_ms()
        report = PassReport()
        since = self.since if self.since is not None else moment - INITIAL_LOOKBACK_MS
        resume = None
        if self.missing is not None:
            report.enqueued, resume = await self.missing(since, moment)
        # A full batch means more may be missing: continue from there on the next pass.
        self.since = resume if resume is not None else moment - OVERLAP_MS
        report.expired_leases = await self._clear_expired_leases(moment)
        async with self.db.read() as session:
            stale = await stale_progress_exists(session, moment)
        if stale:
            async with self.db.write() as session:
                await supersede_stale_progress(session, moment)
        report.overdue = await self._count_overdue(moment)
        report.retired_keys = await retire_expired_keys(self.db, now=moment)
        if (report.enqueued or report.expired_leases or report.overdue) and self.wake:
            self.wake()
        if report.enqueued or report.expired_leases or report.overdue:
            log.warning(
                "webhook reconciliation: %d missing deliveries enqueued, %d expired leases "
                "cleared, %d overdue deliveries",
                report.enqueued,
                report.expired_leases,
                report.overdue,
            )
        return report

    async def _clear_expired_leases(self, now: int) -> int:
        expired = (
            WebhookDelivery.status == DeliveryStatus.PENDING,
            WebhookDelivery.lease_expires_at < now,
        )
        # Read first: an idle service writes nothing.
        async with self.db.read() as session:
            if await session.scalar(select(WebhookDelivery.id).where(*expired).limit(1)) is None:
                return 0
        async with self.db.write() as session:
            return await clear_expired_leases(session, now)

    async def _count_overdue(self, now: int) -> int:
        async with self.db.read() as session:
            overdue = select(WebhookDelivery.id).where(
                and_(
                    WebhookDelivery.status == DeliveryStatus.PENDING,
                    WebhookDelivery.next_attempt_at <= now - OVERDUE_MS,
                )
            )
            count = await session.scalar(
                select(func.count()).select_from(overdue.limit(BATCH).subquery())
            )
        return int(count or 0)
