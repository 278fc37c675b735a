"""The attempt feed: the dispatcher's bookkeeping half, apart from its sending half.

The dispatcher's senders hand in finished attempts (``Outcome``) and ask for more; the feed
records the outcomes, claims the next due deliveries under a lease and signs them, all in
one exchange: the queue's transaction and large signing batches run in threads, so the
dispatcher's loop keeps sending. More delivery capacity comes from more dispatcher
processes, each with its own feed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import NamedTuple

from genhook.config import Settings
from genhook.db import Database, now_ms
from genhook.retry import backoff_delay, clamp
from genhook.sender.fairness import Rooms, destination_of
from genhook.sender.keys import KeyRing, load_encryption_key
from genhook.sender.queue import UNLIMITED, Claimed, Recorded, delivery_queue
from genhook.sender.secret_box import SecretOpener
from genhook.sender.signing import HeaderSigner

log = logging.getLogger(__name__)

# Batches at least this large are signed in the signing thread; a smaller one costs less
# to sign inline than to hand over.
SIGN_IN_THREAD_AT = 4
# A Retry-After is honoured within these bounds (seconds); the upper one is the retry cap.
RETRY_AFTER_MIN_SECONDS = 1.0


class Attempt(NamedTuple):
    """A claimed delivery, signed and ready to send."""

    id: str
    task_id: str
    url: str
    body: bytes
    # Attempts so far and where the current retry budget began; unchanged while leased.
    attempts: int
    round_start: int
    headers: dict[str, str]
    kid: str
    account_id: str = ""
    # ``scheme://host:port``, the unit of fairness and destination health.
    destination: str = ""


class Outcome(NamedTuple):
    """How one attempt ended, as the sender saw it."""

    delivery_id: str
    attempts: int
    round_start: int
    started_at: int
    duration_ms: int
    status_code: int | None
    error: str | None
    excerpt: str | None
    kid: str | None
    retry_after: float | None

    @property
    def acknowledged(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


class LocalFeed:
    """The feed in the calling process: the delivery queue's transaction and a signing
    batch, each in its own thread when ``threads`` is true (the loop is busy sending)."""

    def __init__(
        self,
        settings: Settings,
        db: Database,
        keyring: KeyRing,
        *,
        owner: str,
        lease_ms: int,
        threads: bool = True,
    ) -> None:
        self.settings = settings
        self.keyring = keyring
        self.owner = owner
        self.signer = HeaderSigner(
            settings.webhook_header_brand,
            settings.webhook_signing,
            settings.webhook_standard_headers,
        )
        self.queue = delivery_queue(db)
        self._open_secret: SecretOpener | None = None
        self._lease_ms = lease_ms
        self._threads = threads
        self._signing: ThreadPoolExecutor | None = None

    async def start(self) -> None:
        """Nothing to start: the queue opens its connection on first use."""

    async def exchange(
        self,
        outcomes: Sequence[Outcome],
        limit: int,
        rooms: Rooms = UNLIMITED,
        returned: Sequence[tuple[str, int]] = (),
    ) -> list[Attempt]:
        now = now_ms()
        claimed = await self.queue.tick(
            [self.recorded(outcome, now) for outcome in outcomes],
            owner=self.owner,
            now=now,
            lease_expires_at=now + self._lease_ms,
            limit=limit,
            rooms=rooms,
            returned=returned,
        )
        if not claimed:
            return []
        return await self.sign(claimed)

    async def sign(self, claimed: Sequence[Claimed]) -> list[Attempt]:
        """Fresh headers for each claimed delivery, one timestamp for the batch. Ed25519
        signing releases the GIL, so in its own thread it overlaps with the loop."""
        key = await self.keyring.active()
        executor = None
        if self._threads and len(claimed) >= SIGN_IN_THREAD_AT:
            if self._signing is None:
                self._signing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="webhook-sign")
            executor = self._signing
        if self._open_secret is None:
            self._open_secret = SecretOpener(load_encryption_key(self.settings))
        opened = [replace(c, secret=self._open_secret(c.account_id, c.secret)) for c in claimed]
        signed = await self.signer.sign_many(key, int(time.time()), opened, executor)
        return [
            Attempt(
                c.id,
                c.task_id,
                c.url,
                c.body,
                c.attempts,
                c.round_start,
                headers,
                key.kid,
                c.account_id,
                c.destination or destination_of(c.url),
            )
            for c, headers in zip(claimed, signed, strict=True)
        ]

    async def close(self) -> None:
        if self._signing is not None:
            self._signing.shutdown(wait=False)
            self._signing = None
        await self.queue.close()

    def recorded(self, outcome: Outcome, now: int) -> Recorded:
        number = outcome.attempts + 1
        status, next_at, delivered_at = self.next_state(outcome, number - outcome.round_start, now)
        return Recorded(
            delivery_id=outcome.delivery_id,
            number=number,
            started_at=outcome.started_at,
            duration_ms=outcome.duration_ms,
            status_code=outcome.status_code,
            error=outcome.error,
            excerpt=outcome.excerpt,
            kid=outcome.kid,
            status=status,
            next_attempt_at=next_at,
            delivered_at=delivered_at,
        )

    def next_state(
        self, outcome: Outcome, in_round: int, now: int
    ) -> tuple[str, int | None, int | None]:
        """Status, next attempt time and delivery time after ``outcome``."""
        settings = self.settings
        if outcome.acknowledged:
            return "delivered", None, now
        if outcome.status_code == 410 or in_round >= settings.webhook_retry_max_attempts:
            return "undeliverable", None, None
        cap = settings.webhook_retry_cap_seconds
        if outcome.retry_after is not None:
            delay = clamp(outcome.retry_after, RETRY_AFTER_MIN_SECONDS, cap)
        else:
            delay = backoff_delay(in_round, settings.webhook_retry_base_seconds, cap)
        return "pending", now + int(delay * 1000), None
