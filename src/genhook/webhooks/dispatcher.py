"""Delivery workers: claim due deliveries under a lease, send them, record the outcome.

Claims are one conditional UPDATE (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; SQLite has a
single writer), so any number of processes can dispatch from one database. A claim moves
``next_attempt_at`` to the lease expiry: if the sender dies, the delivery is simply due
again when the lease runs out. Outcomes are written in batches, each attempt record with
its delivery's new state in one transaction, and only while the lease is still held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import cast

import aiohttp
from sqlalchemy import Table, bindparam, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from genhook.config import Settings
from genhook.db import Account, Database, WebhookAttempt, WebhookDelivery, now_ms
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
from genhook.webhooks.signing import HeaderSigner

log = logging.getLogger(__name__)

# Extra lease time beyond the request timeout, for recording the outcome.
LEASE_MARGIN_SECONDS = 30.0
CLAIM_BATCH = 200
RECORD_DELAY_SECONDS = 0.2
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
class Claimed:
    id: str
    task_id: str
    account_id: str
    url: str
    event_type: str
    body: bytes
    # Attempts so far and where the current retry budget began; unchanged while leased.
    attempts: int
    round_start: int
    secret: str | None


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
        self._in_flight: set[asyncio.Task[None]] = set()
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

    # -- the loop ---------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Claim and send until ``stop`` is set; then let in-flight attempts finish."""
        await self.open()
        capacity = self.settings.webhook_concurrency
        poll = self.settings.webhook_poll_seconds
        # Under load, claim and record in chunks rather than one slot at a time: each tick
        # is a write transaction, and one per finished attempt would cost more than the
        # sends themselves. Outcomes wait at most RECORD_DELAY_SECONDS for company.
        chunk = self._chunk
        try:
            while not stop.is_set():
                free = capacity - len(self._in_flight)
                want = free if free >= chunk or (free > 0 and not self._in_flight) else 0
                want = min(want, CLAIM_BATCH)
                pending = len(self._outcomes)
                record = pending >= chunk or (
                    pending > 0
                    and (
                        not self._in_flight
                        or time.monotonic() - self._oldest_outcome >= RECORD_DELAY_SECONDS
                    )
                )
                claimed: Sequence[Claimed] = []
                if want or record:
                    outcomes, self._outcomes = self._outcomes, []
                    try:
                        claimed = await self.tick(outcomes, want)
                    except Exception:
                        # Unrecorded outcomes are sent again when their leases expire.
                        log.exception("webhook dispatch transaction failed; retrying")
                        await _wait(stop, 1.0)
                        continue
                    for item in claimed:
                        task = asyncio.create_task(self._attempt(item))
                        self._in_flight.add(task)
                        task.add_done_callback(self._in_flight.discard)
                    if claimed and len(claimed) == want:
                        await asyncio.sleep(0)
                        continue
                timeout = poll
                if self._outcomes:
                    timeout = min(poll, RECORD_DELAY_SECONDS)
                await self._sleep(timeout)
        finally:
            if self._in_flight:
                await asyncio.gather(*self._in_flight, return_exceptions=True)
            if self._outcomes:
                outcomes, self._outcomes = self._outcomes, []
                try:
                    await self.tick(outcomes, 0)
                except Exception:
                    log.exception("recording the last webhook attempts failed")
            await self.release_leases()
            await self.close()

    async def tick(self, outcomes: Sequence[Outcome], limit: int) -> list[Claimed]:
        """Record finished attempts and claim up to ``limit`` due deliveries, in one
        transaction, so a busy dispatcher pays one write transaction per batch."""
        async with self.db.write() as session:
            if outcomes:
                await self._record(session, outcomes)
            if not limit:
                return []
            return await self._claim(session, limit)

    async def claim(self, limit: int) -> list[Claimed]:
        return await self.tick((), limit)

    async def record(self, outcomes: Sequence[Outcome]) -> None:
        await self.tick(outcomes, 0)

    async def _claim(self, session: AsyncSession, limit: int) -> list[Claimed]:
        now = now_ms()
        expires = now + self._lease_ms
        due = (
            select(_D.id)
            .where(_D.status == "pending", _D.next_attempt_at <= now)
            .order_by(_D.next_attempt_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        stmt = (
            update(_DELIVERIES)
            .where(_D.id.in_(due), _D.status == "pending", _D.next_attempt_at <= now)
            .values(
                lease_owner=self.owner,
                lease_expires_at=expires,
                next_attempt_at=expires,
                updated_at=now,
            )
            .returning(
                _D.id,
                _D.task_id,
                _D.account_id,
                _D.url,
                _D.event_type,
                _D.body,
                _D.attempts,
                _D.round_start,
            )
        )
        rows = (await session.execute(stmt)).all()
        if not rows:
            return []
        secrets: dict[str, str] = {}
        if self.signer.mode == "migration":
            accounts = {row.account_id for row in rows}
            result = await session.execute(
                select(Account.id, Account.signing_secret).where(Account.id.in_(accounts))
            )
            secrets = {account_id: secret for account_id, secret in result.all()}
        return [
            Claimed(
                id=row.id,
                task_id=row.task_id,
                account_id=row.account_id,
                url=row.url,
                event_type=row.event_type,
                body=bytes(row.body),
                attempts=row.attempts,
                round_start=row.round_start,
                secret=secrets.get(row.account_id),
            )
            for row in rows
        ]

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

    async def _attempt(self, item: Claimed) -> None:
        try:
            outcome = await self.send(item)
        except Exception as exc:  # never lose the lease silently on an unexpected error
            log.exception("webhook attempt for %s failed unexpectedly", item.id)
            outcome = Outcome(item, now_ms(), 0, None, f"internal error: {exc}", None, None, None)
        if not self._outcomes:
            self._oldest_outcome = time.monotonic()
        self._outcomes.append(outcome)
        # Wake the loop only when there is something to do: a chunk of free slots or of
        # outcomes, or nothing else in flight (this task leaves the set right after).
        free = self.settings.webhook_concurrency - len(self._in_flight) + 1
        if free >= self._chunk or len(self._outcomes) >= self._chunk or len(self._in_flight) <= 1:
            self.wake()

    async def send(self, item: Claimed) -> Outcome:
        started = now_ms()
        clock = time.perf_counter()
        kid: str | None = None

        def done(
            status: int | None,
            error: str | None,
            excerpt: str | None = None,
            retry_after: float | None = None,
        ) -> Outcome:
            elapsed = int((time.perf_counter() - clock) * 1000)
            return Outcome(item, started, elapsed, status, error, excerpt, kid, retry_after)

        try:
            target = _parse(item.url, self.policy.allow_private)
        except TargetRefused as exc:
            return done(None, f"target refused: the URL {exc.detail}")
        plain = target.scheme == "http"
        if target.ip is not None and not self.policy.allows(
            _classify(target.ip), require_private=plain
        ):
            return done(None, "target refused: address not allowed")
        session = self._http if plain else self._https
        if session is None:
            return done(None, "target refused: plain http needs private targets allowed")
        key = await self.keyring.active()
        kid = key.kid
        headers = self.signer.headers(
            session_id=item.task_id,
            event_type=item.event_type,
            body=item.body,
            timestamp=int(time.time()),
            key=key,
            hmac_secret=item.secret,
        )
        limit = self.settings.webhook_response_excerpt_bytes
        try:
            async with session.post(
                target.url, data=item.body, headers=headers, allow_redirects=False
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

    async def _record(self, session: AsyncSession, outcomes: Sequence[Outcome]) -> None:
        """Attempt records and next states, only for deliveries whose lease is still ours.

        A lease is lost only if it expired (a stalled process) and another sender claimed
        the delivery; its outcome is then dropped, and the attempt is the other sender's.
        """
        now = now_ms()
        held = await session.execute(
            select(_D.id)
            .where(
                _D.id.in_([o.delivery.id for o in outcomes]),
                _D.lease_owner == self.owner,
                _D.status == "pending",
            )
            .with_for_update()
        )
        ours = set(held.scalars().all())
        changes: list[dict[str, object]] = []
        attempts: list[dict[str, object]] = []
        for outcome in outcomes:
            item = outcome.delivery
            if item.id not in ours:
                log.info("lease on %s was lost; outcome discarded", item.id)
                continue
            number = item.attempts + 1
            changes.append(
                {
                    "b_id": item.id,
                    "b_attempts": number,
                    "b_code": outcome.status_code,
                    "b_error": outcome.error,
                    "b_last": outcome.started_at,
                    **self._next_state(outcome, number - item.round_start, now),
                }
            )
            attempts.append(
                {
                    "delivery_id": item.id,
                    "number": number,
                    "started_at": outcome.started_at,
                    "duration_ms": outcome.duration_ms,
                    "status_code": outcome.status_code,
                    "error": outcome.error,
                    "response_excerpt": outcome.excerpt,
                    "kid": outcome.kid,
                }
            )
        if changes:
            await session.execute(_RECORD.values(updated_at=now), changes)
            await session.execute(insert(_ATTEMPTS), attempts)

    def _next_state(self, outcome: Outcome, in_round: int, now: int) -> dict[str, object]:
        """Status, next attempt time and delivery time, as ``_RECORD`` parameters."""
        settings = self.settings
        if outcome.acknowledged:
            return {"b_status": "delivered", "b_next": None, "b_delivered": now}
        if outcome.status_code == 410 or in_round >= settings.webhook_retry_max_attempts:
            return {"b_status": "undeliverable", "b_next": None, "b_delivered": None}
        cap = settings.webhook_retry_cap_seconds
        if outcome.retry_after is not None:
            delay = clamp(outcome.retry_after, RETRY_AFTER_MIN_SECONDS, cap)
        else:
            delay = backoff_delay(in_round, settings.webhook_retry_base_seconds, cap)
        return {"b_status": "pending", "b_next": now + int(delay * 1000), "b_delivered": None}


_DELIVERIES = cast(Table, WebhookDelivery.__table__)
_ATTEMPTS = cast(Table, WebhookAttempt.__table__)
_D = _DELIVERIES.c
# One executemany UPDATE records a whole batch of outcomes.
_RECORD = (
    update(_DELIVERIES)
    .where(_D.id == bindparam("b_id"))
    .values(
        attempts=bindparam("b_attempts"),
        status=bindparam("b_status"),
        next_attempt_at=bindparam("b_next"),
        delivered_at=func.coalesce(bindparam("b_delivered"), _D.delivered_at),
        lease_owner=None,
        lease_expires_at=None,
        last_status_code=bindparam("b_code"),
        last_error=bindparam("b_error"),
        last_attempt_at=bindparam("b_last"),
    )
)


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
