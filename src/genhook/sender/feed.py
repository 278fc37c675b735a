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

from genhook.config import Settings
from genhook.db import Database, now_ms
from genhook.retry import backoff_delay, clamp
from genhook.sender.fairness import (
    RETRY_AFTER_MIN_SECONDS,
    Rooms,
    Stop,
    destination_of,
    endpoint_of,
)
from genhook.sender.keys import KeyRing, load_encryption_key
from genhook.sender.queue import UNLIMITED, Outcome, Outgoing, Ticked, delivery_queue
from genhook.sender.secret_box import SecretOpener
from genhook.sender.signing import HeaderSigner
from genhook.statuses import DeliveryStatus

log = logging.getLogger(__name__)

# Batches at least this large are signed in the signing thread; a smaller one costs less
# to sign inline than to hand over.
SIGN_IN_THREAD_AT = 4


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

    @property
    def claims_alone(self) -> bool:
        """Whether an idle dispatcher's claim goes sooner alone (``DeliveryQueue``)."""
        return self.queue.claims_alone

    async def start(self) -> None:
        """Nothing to start: the queue opens its connection on first use."""

    async def exchange(
        self,
        outcomes: Sequence[Outcome],
        limit: int,
        rooms: Rooms = UNLIMITED,
        returned: Sequence[tuple[str, int]] = (),
        inline: bool = False,
        stops: Sequence[Stop] = (),
    ) -> Ticked:
        """Record ``outcomes`` and claim up to ``limit`` deliveries, signed (see
        ``DeliveryQueue.tick``)."""
        now = now_ms()
        for outcome in outcomes:
            self.settle(outcome, now)
        ticked = await self.queue.tick(
            outcomes,
            owner=self.owner,
            now=now,
            lease_expires_at=now + self._lease_ms,
            limit=limit,
            rooms=rooms,
            returned=returned,
            inline=inline,
            stops=stops,
        )
        if ticked.claimed:
            ticked.claimed = await self.sign(ticked.claimed)
        return ticked

    async def sign(self, claimed: list[Outgoing]) -> list[Outgoing]:
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
        for c in claimed:
            c.secret = self._open_secret(c.account_id, c.secret)
        signed = await self.signer.sign_many(key, int(time.time()), claimed, executor)
        for c, headers in zip(claimed, signed, strict=True):
            c.headers = headers
            c.kid = key.kid
            c.secret = None  # in the headers now; not kept beside them
            c.destination = c.destination or destination_of(c.url)
            c.endpoint = c.endpoint or endpoint_of(c.url)
        return claimed

    async def close(self) -> None:
        if self._signing is not None:
            self._signing.shutdown(wait=False)
            self._signing = None
        await self.queue.close()

    def settle(self, outcome: Outcome, now: int) -> None:
        """Set the state ``outcome`` moves its delivery to."""
        in_round = outcome.number - outcome.round_start
        status, next_at, delivered_at = self.next_state(outcome, in_round, now)
        outcome.status = status
        outcome.next_attempt_at = next_at
        outcome.delivered_at = delivered_at

    def next_state(
        self, outcome: Outcome, in_round: int, now: int
    ) -> tuple[DeliveryStatus, int | None, int | None]:
        """Status, next attempt time and delivery time after ``outcome``."""
        settings = self.settings
        if outcome.acknowledged:
            return DeliveryStatus.DELIVERED, None, now
        if gives_up(settings, outcome, in_round):
            return DeliveryStatus.UNDELIVERABLE, None, None
        cap = settings.webhook_retry_cap_seconds
        if outcome.retry_after is not None:
            delay = clamp(outcome.retry_after, RETRY_AFTER_MIN_SECONDS, cap)
        else:
            delay = backoff_delay(in_round, settings.webhook_retry_base_seconds, cap)
        return DeliveryStatus.PENDING, now + int(delay * 1000), None


def gives_up(settings: Settings, outcome: Outcome, in_round: int) -> bool:
    """Whether a failed attempt, number ``in_round`` of its round, ends its delivery."""
    return outcome.status_code == 410 or in_round >= settings.webhook_retry_max_attempts
