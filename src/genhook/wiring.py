"""The composition root of the task domain and the webhook side.

``genhook.sender`` never imports ``genhook.tasks``; ``tasks/`` talks to it through its
outbox port (``genhook.tasks.outbox``). This module puts the two together: the outbox the
task domain publishes to, the webhook service with the reconciler's missing terminal
events and the retention job, and the sweeper's ``Lifecycle``.
"""

from __future__ import annotations

import ssl
from typing import Any

from genhook.config import Settings
from genhook.db import Database
from genhook.net import AddressPolicy, Resolver
from genhook.sender.outbox import WebhookOutbox
from genhook.sender.reconcile import Reconciler
from genhook.sender.service import WebhookService
from genhook.storage import BlobStore, open_blob_store
from genhook.tasks.lifecycle import Lifecycle
from genhook.tasks.outbox import Outbox
from genhook.tasks.retention import Retention


def outbox() -> Outbox:
    """The task domain's outbox: webhook deliveries."""
    return WebhookOutbox()


def lifecycle(settings: Settings, db: Database, storage: BlobStore) -> Lifecycle:
    """The task state machine, publishing to the webhook outbox (workers, the sweeper)."""
    return Lifecycle(settings, db, storage, outbox=outbox())


def reconciler(
    settings: Settings, db: Database, storage: BlobStore | None = None, **options: Any
) -> Reconciler:
    """The webhook reconciler, publishing terminal events the fast path missed."""
    tasks = lifecycle(settings, db, storage or open_blob_store(settings, db))
    return Reconciler(settings, db, missing=tasks.enqueue_missing, **options)


def webhook_service(
    settings: Settings,
    db: Database,
    *,
    storage: BlobStore | None = None,
    resolver: Resolver | None = None,
    policy: AddressPolicy | None = None,
    ssl_context: ssl.SSLContext | None = None,
    owner: str | None = None,
    **options: Any,
) -> WebhookService:
    """Webhook delivery with reconciliation and retention beside it (the dispatcher role)."""
    storage = storage or open_blob_store(settings, db)
    port = outbox()
    tasks = Lifecycle(settings, db, storage, outbox=port)
    retention = Retention(settings, db, storage, outbox=port)
    return WebhookService(
        settings,
        db,
        resolver=resolver,
        policy=policy,
        ssl_context=ssl_context,
        owner=owner,
        missing=tasks.enqueue_missing,
        jobs=[retention.run_forever],
        **options,
    )
