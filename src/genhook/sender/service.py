"""The webhook delivery service: dispatcher and reconciliation sweeper, in one process.

Run it in as many processes and machines as needed against one database; claims are safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from typing import TYPE_CHECKING

from genhook.config import Settings
from genhook.db import Database
from genhook.net import AddressPolicy, Resolver
from genhook.runtime import wakeups
from genhook.sender.dispatcher import LEASE_MARGIN_SECONDS, Dispatcher
from genhook.sender.keys import KeyRing, ensure_signing_key
from genhook.sender.reconcile import Reconciler
from genhook.storage import open_blob_store

if TYPE_CHECKING:
    from genhook.tasks.retention import Retention

__all__ = ["WebhookService", "ensure_signing_key"]

log = logging.getLogger(__name__)


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
        self.reconciler = Reconciler(settings, db, wake=self.wake)

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
        # Deliveries enqueued by any process wake this dispatcher (genhook.wakeups).
        wake = wakeups.subscribe(self.db.url, wakeups.DELIVERIES, dispatcher.wake)
        sweeper = asyncio.create_task(self._reconcile_forever(stop))
        # Output retention runs on this role too, beside reconciliation.
        retention = asyncio.create_task(self._retention().run_forever(stop))
        try:
            await dispatcher.run(stop)
        finally:
            wake.close()
            if not stop.is_set():
                sweeper.cancel()
                retention.cancel()
            await asyncio.gather(sweeper, retention, return_exceptions=True)

    def _retention(self) -> Retention:
        # The task domain imports the outbox, so this side imports it late.
        from genhook.tasks.retention import Retention

        return Retention(self.settings, self.db, open_blob_store(self.settings, self.db))

    async def _reconcile_forever(self, stop: asyncio.Event) -> None:
        interval = self.settings.webhook_reconcile_interval_seconds
        while not stop.is_set():
            try:
                await self.reconciler.run_once()
            except Exception:
                log.exception("webhook reconciliation failed; retrying next interval")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
