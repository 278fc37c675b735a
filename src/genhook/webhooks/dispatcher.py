"""Delivery workers: claim due deliveries under a lease, sign and send them, record the
outcome.

Claims and records go through the delivery queue (``genhook.webhooks.queue``), one write
transaction per batch, so any number of processes can dispatch from one database. Claimed
attempts are signed in a batch (in a signing thread) and wait in a ready queue for a pool of
sender tasks; the next batch is claimed while the current one is on the wire. An outcome is
recorded only while its lease is still held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache

import aiohttp
from sqlalchemy import update
from yarl import URL

from genhook.config import Settings
from genhook.db import Database, WebhookDelivery, now_ms
from genhook.net import (
    AddressPolicy,
    AddressRefused,
    Target,
    TargetRefused,
    classify,
    client_ssl_context,
    pinned_connector,
)
from genhook.net import parse_target as _parse_target
from genhook.retry import backoff_delay, clamp, parse_retry_after
from genhook.webhooks.keys import KeyRing
from genhook.webhooks.queue import Claimed, Recorded, delivery_queue
from genhook.webhooks.signing import HeaderSigner

log = logging.getLogger(__name__)

# Extra lease time beyond the request timeout, for recording the outcome.
LEASE_MARGIN_SECONDS = 30.0
CLAIM_BATCH = 256
# Up to this many rounds of ``webhook_concurrency`` attempts wait ready behind the senders.
READY_ROUNDS = 2
RECORD_DELAY_SECONDS = 0.2
# Batches at least this large are signed in the signing thread; a smaller one costs less
# to sign inline than to hand over.
SIGN_IN_THREAD_AT = 4
# A Retry-After is honoured within these bounds (seconds); the upper one is the retry cap.
RETRY_AFTER_MIN_SECONDS = 1.0
RETRY_AFTER_STATUSES = frozenset({429, 503})


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"


@lru_cache(maxsize=4096)
def _parse(url: str, allow_http: bool) -> Target:
    schemes = frozenset({"http", "https"}) if allow_http else frozenset({"https"})
    return _parse_target(url, schemes=schemes)


_classify = lru_cache(maxsize=4096)(classify)


@dataclass(frozen=True, slots=True)
class Outcome:
    delivery: Claimed
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


@dataclass(frozen=True, slots=True)
class _Ready:
    """A claimed attempt, checked and signed, waiting for a sender."""

    item: Claimed
    url: URL
    session: aiohttp.ClientSession
    headers: dict[str, str]
    kid: str


class Dispatcher:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        *,
        policy: AddressPolicy,
        keyring: KeyRing,
        ssl_context: ssl.SSLContext | None = None,
        owner: str | None = None,
        lease_margin_seconds: float = LEASE_MARGIN_SECONDS,
    ) -> None:
        self.settings = settings
        self.db = db
        self.policy = policy
        self.keyring = keyring
        self.owner = owner or default_owner()
        self.signer = HeaderSigner(settings.webhook_header_brand, settings.webhook_signing)
        self._ssl = ssl_context or client_ssl_context(settings.webhook_ca_file)
        self._lease_ms = int((settings.webhook_timeout_seconds + lease_margin_seconds) * 1000)
        self._woken = False
        self._waiter: asyncio.Future[None] | None = None
        self._chunk = max(1, min(settings.webhook_concurrency // 4, CLAIM_BATCH))
        self._outcomes: list[Outcome] = []
        self._oldest_outcome = 0.0
        self._capacity = settings.webhook_concurrency
        self._ready: deque[_Ready] = deque()
        self._idle: deque[asyncio.Future[None]] = deque()
        self._busy = 0
        self._stopping = False
        self._signing_count = 0
        self._launches: set[asyncio.Task[None]] = set()
        self.queue = delivery_queue(db)
        self._signing: ThreadPoolExecutor | None = None
        self._https: aiohttp.ClientSession | None = None
        self._http: aiohttp.ClientSession | None = None
        self.sent = 0

    def wake(self) -> None:
        """Look for due deliveries now; safe to call at any time from the loop's thread."""
        self._woken = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _sleep(self, timeout: float) -> None:
        """Until ``wake()`` or ``timeout``; cheaper than waiting on events with tasks."""
        if self._woken:
            self._woken = False
            return
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._waiter = waiter
        handle = loop.call_later(timeout, _resolve, waiter)
        try:
            await waiter
        finally:
            handle.cancel()
            self._waiter = None
            self._woken = False

    # -- sessions ---------------------------------------------------------------------------

    def _session(self, *, require_private: bool) -> aiohttp.ClientSession:
        timeout = self.settings.webhook_timeout_seconds
        return aiohttp.ClientSession(
            connector=pinned_connector(
                self.policy,
                require_private=require_private,
                ssl_context=self._ssl,
                limit=self.settings.webhook_concurrency,
            ),
            timeout=aiohttp.ClientTimeout(total=timeout, connect=timeout),
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
            auto_decompress=False,
        )

    async def open(self) -> None:
        # Ed25519 signing releases the GIL: in its own thread it overlaps with the loop.
        self._signing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="webhook-sign")
        self._https = self._session(require_private=False)
        if self.policy.allow_private:
            # Plain http is allowed only towards private addresses; a separate connector
            # enforces that at connect time.
            self._http = self._session(require_private=True)

    async def close(self) -> None:
        for session in (self._https, self._http):
            if session is not None:
                await session.close()
        self._https = self._http = None
        if self._signing is not None:
            self._signing.shutdown(wait=False)
            self._signing = None
        await self.queue.close()

    # -- the loop ---------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Claim and send until ``stop`` is set; then let in-flight attempts finish.

        ``webhook_concurrency`` sender tasks take signed attempts from a ready queue that
        this loop keeps topped up: the next batch is claimed and signed while the current
        one is on the wire, so senders do not wait for a transaction. Each tick also
        records the attempts that ended; under load claims and records go in chunks, since
        one write transaction per attempt would cost more than the sends themselves.
        Outcomes wait at most RECORD_DELAY_SECONDS for company.
        """
        await self.open()
        self._stopping = False
        poll = self.settings.webhook_poll_seconds
        senders = [asyncio.create_task(self._sender()) for _ in range(self._capacity)]
        try:
            while not stop.is_set():
                want = self._want()
                if want or self._record_due():
                    outcomes, self._outcomes = self._outcomes, []
                    try:
                        claimed = await self.tick(outcomes, want)
                    except Exception:
                        # Unrecorded outcomes are sent again when their leases expire.
                        log.exception("webhook dispatch transaction failed; retrying")
                        await _wait(stop, 1.0)
                        continue
                    if claimed:
                        # Signing runs in its own thread while the next claim is made.
                        self._signing_count += len(claimed)
                        launch = asyncio.create_task(self._launch(claimed))
                        self._launches.add(launch)
                        launch.add_done_callback(self._launches.discard)
                    if want and len(claimed) == want:
                        await asyncio.sleep(0)
                        continue  # more may be due
                await self._sleep(min(poll, RECORD_DELAY_SECONDS) if self._outcomes else poll)
        finally:
            # Attempts not started yet are given back by release_leases() below.
            if self._launches:
                await asyncio.gather(*self._launches, return_exceptions=True)
            self._stopping = True
            self._ready.clear()
            self._wake_senders(len(self._idle))
            await asyncio.gather(*senders, return_exceptions=True)
            if self._outcomes:
                outcomes, self._outcomes = self._outcomes, []
                try:
                    await self.tick(outcomes, 0)
                except Exception:
                    log.exception("recording the last webhook attempts failed")
            await self.release_leases()
            await self.close()

    def _want(self) -> int:
        """How many deliveries to claim now. Up to two rounds wait ready behind the busy
        senders, so a claim (a transaction and a signing batch, each in its own thread)
        ends long before the senders run out, even while the loop keeps those threads
        waiting for the GIL."""
        ready = len(self._ready) + self._signing_count
        room = READY_ROUNDS * 2 * self._capacity - self._busy - ready
        if ready >= READY_ROUNDS * self._capacity or room <= 0:
            return 0
        if room >= self._chunk or (not self._busy and not ready):
            return min(room, CLAIM_BATCH)
        return 0

    def _record_due(self) -> bool:
        pending = len(self._outcomes)
        return pending >= self._chunk or (
            pending > 0
            and (not self._busy or time.monotonic() - self._oldest_outcome >= RECORD_DELAY_SECONDS)
        )

    async def tick(self, outcomes: Sequence[Outcome], limit: int) -> list[Claimed]:
        """Record finished attempts and claim up to ``limit`` due deliveries, in one
        transaction, so a busy dispatcher pays one write transaction per batch."""
        now = now_ms()
        return await self.queue.tick(
            [self._recorded(outcome, now) for outcome in outcomes],
            owner=self.owner,
            now=now,
            lease_expires_at=now + self._lease_ms,
            limit=limit,
        )

    async def claim(self, limit: int) -> list[Claimed]:
        return await self.tick((), limit)

    async def release_leases(self) -> None:
        """Make deliveries this process still holds due again at once (graceful stop)."""
        now = now_ms()
        try:
            async with self.db.write() as session:
                await session.execute(
                    update(WebhookDelivery)
                    .where(
                        WebhookDelivery.status == "pending",
                        WebhookDelivery.lease_owner == self.owner,
                    )
                    .values(
                        lease_owner=None, lease_expires_at=None, next_attempt_at=now, updated_at=now
                    )
                    .execution_options(synchronize_session=False)
                )
        except Exception:
            log.exception("releasing webhook leases failed; they expire on their own")

    # -- one attempt ------------------------------------------------------------------------

    async def _launch(self, claimed: Sequence[Claimed]) -> None:
        """Check each target, sign the rest in one batch, and queue them for the senders."""
        try:
            await self._sign_and_queue(claimed)
        finally:
            self._signing_count -= len(claimed)
            self.wake()

    async def _sign_and_queue(self, claimed: Sequence[Claimed]) -> None:
        sendable: list[tuple[Claimed, URL, aiohttp.ClientSession]] = []
        for item in claimed:
            checked = self._check(item)
            if isinstance(checked, str):
                self._finished(Outcome(item, now_ms(), 0, None, checked, None, None, None))
            else:
                sendable.append((item, *checked))
        if not sendable:
            return
        try:
            key = await self.keyring.active()
            executor = self._signing if len(sendable) >= SIGN_IN_THREAD_AT else None
            batch = [item for item, _, _ in sendable]
            signed = await self.signer.sign_many(key, int(time.time()), batch, executor)
        except Exception as exc:  # never lose the leases silently
            log.exception("signing %d webhook attempts failed", len(sendable))
            for item, _, _ in sendable:
                error = f"internal error: {exc}"
                self._finished(Outcome(item, now_ms(), 0, None, error, None, None, None))
            return
        self._ready.extend(
            _Ready(item, url, session, headers, key.kid)
            for (item, url, session), headers in zip(sendable, signed, strict=True)
        )
        self._wake_senders(len(sendable))

    def _wake_senders(self, count: int) -> None:
        idle = self._idle
        for _ in range(min(count, len(idle))):
            waiter = idle.popleft()
            if not waiter.done():
                waiter.set_result(None)

    async def _sender(self) -> None:
        loop = asyncio.get_running_loop()
        ready = self._ready
        while True:
            if not ready:
                if self._stopping:
                    return
                waiter: asyncio.Future[None] = loop.create_future()
                self._idle.append(waiter)
                await waiter
                continue
            job = ready.popleft()
            self._busy += 1
            try:
                outcome = await self.send(job.item, job.url, job.session, job.headers, job.kid)
            except Exception as exc:  # never lose the lease silently on an unexpected error
                log.exception("webhook attempt for %s failed unexpectedly", job.item.id)
                error = f"internal error: {exc}"
                outcome = Outcome(job.item, now_ms(), 0, None, error, None, job.kid, None)
            finally:
                self._busy -= 1
            self._finished(outcome)

    def _check(self, item: Claimed) -> tuple[URL, aiohttp.ClientSession] | str:
        """The URL and session to send ``item`` with, or why its target is refused."""
        try:
            target = _parse(item.url, self.policy.allow_private)
        except TargetRefused as exc:
            return f"target refused: the URL {exc.detail}"
        plain = target.scheme == "http"
        if target.ip is not None and not self.policy.allows(
            _classify(target.ip), require_private=plain
        ):
            return "target refused: address not allowed"
        session = self._http if plain else self._https
        if session is None:
            return "target refused: plain http needs private targets allowed"
        return target.url, session

    def _finished(self, outcome: Outcome) -> None:
        if not self._outcomes:
            self._oldest_outcome = time.monotonic()
        self._outcomes.append(outcome)
        # Wake the loop only when there is something to do: a chunk of outcomes, room for
        # a claim (the same test as _want), or nothing else in flight.
        queued = len(self._ready) + self._signing_count
        if (
            len(self._outcomes) >= self._chunk
            or queued < READY_ROUNDS * self._capacity
            or not self._busy
        ):
            self.wake()

    async def send(
        self,
        item: Claimed,
        url: URL,
        session: aiohttp.ClientSession,
        headers: dict[str, str],
        kid: str,
    ) -> Outcome:
        """One POST of the exact body bytes; a 3xx is a failure (redirects are not followed)."""
        started = now_ms()
        clock = time.perf_counter()

        def done(
            status: int | None,
            error: str | None,
            excerpt: str | None = None,
            retry_after: float | None = None,
        ) -> Outcome:
            elapsed = int((time.perf_counter() - clock) * 1000)
            return Outcome(item, started, elapsed, status, error, excerpt, kid, retry_after)

        limit = self.settings.webhook_response_excerpt_bytes
        try:
            async with session.post(
                url, data=item.body, headers=headers, allow_redirects=False
            ) as response:
                raw = await _read_up_to(response, limit)
                status = response.status
                retry_after = None
                if status in RETRY_AFTER_STATUSES:
                    retry_after = parse_retry_after(response.headers.get("Retry-After"))
                # Text columns (PostgreSQL) refuse NUL characters; receivers may send any bytes.
                excerpt = raw.decode("utf-8", errors="replace").replace("\x00", "\ufffd") or None
        except TimeoutError:
            return done(None, f"timeout after {self.settings.webhook_timeout_seconds:g} s")
        except aiohttp.ClientConnectorCertificateError:
            return done(None, "TLS certificate verification failed")
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, AddressRefused):
                return done(None, f"target refused: {exc.os_error.detail}")
            return done(None, f"connection failed: {exc.os_error.strerror or exc.os_error}")
        except aiohttp.ClientError as exc:
            return done(None, f"{type(exc).__name__}: {exc}")
        self.sent += 1
        error = None
        if 300 <= status < 400:
            error = f"redirect not followed (HTTP {status})"
        elif not 200 <= status < 300:
            error = f"HTTP {status}"
        return done(status, error, excerpt, retry_after)

    # -- recording --------------------------------------------------------------------------

    def _recorded(self, outcome: Outcome, now: int) -> Recorded:
        item = outcome.delivery
        number = item.attempts + 1
        status, next_at, delivered_at = self._next_state(outcome, number - item.round_start, now)
        return Recorded(
            delivery_id=item.id,
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

    def _next_state(
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


async def _read_up_to(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """At most ``limit`` bytes of the body; a longer body closes the connection."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = await response.content.read(limit - size)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
    if not response.content.at_eof():
        response.close()
    return b"".join(chunks)


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
