"""The webhook delivery service: dispatcher and reconciliation sweeper, in one process.

Run it in as many processes and machines as needed against one database; claims are safe.
What it needs of the task domain (the reconciler's missing terminal events, the retention
job that runs beside it) is handed in by the composition root, ``genhook.wiring``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from genhook.config import Settings
from genhook.db import Database, wakeups
from genhook.net import AddressPolicy, Resolver
from genhook.sender.dispatcher import LEASE_MARGIN_SECONDS, Dispatcher
from genhook.sender.keys import KeyRing, ensure_signing_key
from genhook.sender.reconcile import MissingEvents, Reconciler

__all__ = ["WebhookService", "ensure_signing_key"]

log = logging.getLogger(__name__)

# A job run beside the dispatcher until the event is set (retention).
Job = Callable[[asyncio.Event], Coroutine[Any, Any, None]]


class WebhookService:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        *,
        resolver: Resolver | None = None,
        policy: AddressPolicy | None = None,
        ssl_context: ssl.SSLContext | None = None,
        owner: str | None = None,
        lease_margin_seconds: float = LEASE_MARGIN_SECONDS,
        missing: MissingEvents | None = None,
        jobs: Sequence[Job] = (),
    ) -> None:
        self.settings = settings
        self.db = db
        self.policy = policy or AddressPolicy(
            allow_private=settings.webhook_allow_private_targets, resolver=resolver
        )
        self._ssl_context = ssl_context
        self._owner = owner
        self._lease_margin = lease_margin_seconds
        self.dispatcher: Dispatcher | None = None
        self.reconciler = Reconciler(settings, db, wake=self.wake, missing=missing)
        self._jobs = list(jobs)

    def wake(self) -> None:
        """Look for due deliveries now instead of at the next poll."""
        if self.dispatcher is not None:
            self.dispatcher.wake()

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until ``stop`` is set; in-flight attempts finish, held leases are released."""
        await ensure_signing_key(self.db, self.settings)
        self.dispatcher = Dispatcher(
            self.settings,
            self.db,
            policy=self.policy,
            keyring=KeyRing(self.db, self.settings),
            ssl_context=self._ssl_context,
            owner=self._owner,
            lease_margin_seconds=self._lease_margin,
        )
        dispatcher = self.dispatcher
        # Deliveries enqueued by any process wake this dispatcher (genhook.db.wakeups).
        wake = wakeups.subscribe(self.db.url, wakeups.DELIVERIES, dispatcher.wake)
        sweeper = asyncio.create_task(self._reconcile_forever(stop))
        # Output retention runs on this role too, beside reconciliation.
        others = [asyncio.create_task(job(stop)) for job in self._jobs]
        try:
            await dispatcher.run(stop)
        finally:
            wake.close()
            if not stop.is_set():
                sweeper.cancel()
                for other in others:
                    other.cancel()
            await asyncio.gather(sweeper, *others, return_exceptions=True)

    async def _reconcile_forever(self, stop: asyncio.Event) -> None:
        interval = self.settings.webhook_reconcile_interval_seconds
        while not stop.is_set():
            try:
                await self.reconciler.run_once()
            except Exception:
                log.exception("webhook reconciliation failed; retrying next interval")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
