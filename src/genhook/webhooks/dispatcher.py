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

from genhook.config import Settings
from genhook.db import Account, Database, WebhookAttempt, WebhookDelivery, now_ms
from genhook.net import (
    AddressPolicy,
    AddressRefused,
    Target,
    TargetRefused,
    classify,
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
WRITE_BATCH = 500
# A Retry-After is honoured within these bounds (seconds); the upper one is the retry cap.
RETRY_AFTER_MIN_SECONDS = 1.0
RETRY_AFTER_STATUSES = frozenset({429, 503})


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"


def build_ssl_context(settings: Settings) -> ssl.SSLContext:
    """System trust store, plus ``webhook_ca_file`` when set; always verifies host names."""
    context = ssl.create_default_context()
    if settings.webhook_ca_file is not None:
        context.load_verify_locations(cafile=str(settings.webhook_ca_file))
    return context


@lru_cache(maxsize=4096)
def _parse(url: str, allow_http: bool) -> Target:
    schemes = frozenset({"http", "https"}) if allow_http else frozenset({"https"})
    return _parse_target(url, schemes=schemes)


@dataclass(frozen=True, slots=True)
class Claimed:
    id: str
    task_id: str
    account_id: str
    url: str
    event_type: str
    body: bytes
    attempts: int
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
        self._ssl = ssl_context or build_ssl_context(settings)
        self._lease_ms = int((settings.webhook_timeout_seconds + lease_margin_seconds) * 1000)
        self._wake = asyncio.Event()
        self._results: asyncio.Queue[Outcome] = asyncio.Queue()
        self._in_flight: set[asyncio.Task[None]] = set()
        self._https: aiohttp.ClientSession | None = None
        self._http: aiohttp.ClientSession | None = None
        self.sent = 0

    def wake(self) -> None:
        self._wake.set()

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
        writer = asyncio.create_task(self._write_loop())
        capacity = self.settings.webhook_concurrency
        poll = self.settings.webhook_poll_seconds
        try:
            while not stop.is_set():
                free = capacity - len(self._in_flight)
                claimed: Sequence[Claimed] = []
                if free > 0:
                    try:
                        claimed = await self.claim(min(free, CLAIM_BATCH))
                    except Exception:
                        log.exception("claiming webhook deliveries failed; retrying")
                        await _wait(stop, 1.0)
                        continue
                    for item in claimed:
                        task = asyncio.create_task(self._attempt(item))
                        self._in_flight.add(task)
                        task.add_done_callback(self._done)
                if free > 0 and len(claimed) == min(free, CLAIM_BATCH):
                    await asyncio.sleep(0)
                    continue
                self._wake.clear()
                await _wait_any(stop, self._wake, poll)
        finally:
            if self._in_flight:
                await asyncio.gather(*self._in_flight, return_exceptions=True)
            await self._results.join()
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            await self.release_leases()
            await self.close()

    def _done(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        self._wake.set()

    async def claim(self, limit: int) -> list[Claimed]:
        now = now_ms()
        expires = now + self._lease_ms
        due = (
            select(WebhookDelivery.id)
            .where(WebhookDelivery.status == "pending", WebhookDelivery.next_attempt_at <= now)
            .order_by(WebhookDelivery.next_attempt_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        stmt = (
            update(WebhookDelivery)
            .where(
                WebhookDelivery.id.in_(due),
                WebhookDelivery.status == "pending",
                WebhookDelivery.next_attempt_at <= now,
            )
            .values(
                lease_owner=self.owner,
                lease_expires_at=expires,
                next_attempt_at=expires,
                updated_at=now,
            )
            .returning(
                WebhookDelivery.id,
                WebhookDelivery.task_id,
                WebhookDelivery.account_id,
                WebhookDelivery.url,
                WebhookDelivery.event_type,
                WebhookDelivery.body,
                WebhookDelivery.attempts,
            )
            .execution_options(synchronize_session=False)
        )
        async with self.db.write() as session:
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
        await self._results.put(outcome)

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
            classify(target.ip), require_private=plain
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
                excerpt = raw.decode("utf-8", errors="replace") if raw else None
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

    async def _write_loop(self) -> None:
        while True:
            batch = [await self._results.get()]
            while len(batch) < WRITE_BATCH and not self._results.empty():
                batch.append(self._results.get_nowait())
            try:
                await self.record(batch)
            except Exception:
                # The leases expire and the deliveries are sent again (at-least-once).
                log.exception("recording %d webhook attempts failed", len(batch))
            finally:
                for _ in batch:
                    self._results.task_done()

    async def record(self, outcomes: Sequence[Outcome]) -> None:
        """Attempt records and next states, in one transaction, for leases still held."""
        now = now_ms()
        ids = [o.delivery.id for o in outcomes]
        async with self.db.write() as session:
            held = await session.execute(
                select(WebhookDelivery.id, WebhookDelivery.attempts, WebhookDelivery.round_start)
                .where(
                    WebhookDelivery.id.in_(ids),
                    WebhookDelivery.lease_owner == self.owner,
                    WebhookDelivery.status == "pending",
                )
                .with_for_update()
            )
            current = {row.id: (row.attempts, row.round_start) for row in held.all()}
            changes: list[dict[str, object]] = []
            attempts: list[dict[str, object]] = []
            for outcome in outcomes:
                state = current.pop(outcome.delivery.id, None)
                if state is None:
                    log.info("lease on %s was lost; outcome discarded", outcome.delivery.id)
                    continue
                number = state[0] + 1
                changes.append(
                    {
                        "b_id": outcome.delivery.id,
                        "b_attempts": number,
                        "b_code": outcome.status_code,
                        "b_error": outcome.error,
                        "b_last": outcome.started_at,
                        **self._next_state(outcome, number - state[1], now),
                    }
                )
                attempts.append(
                    {
                        "delivery_id": outcome.delivery.id,
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
                conn = await session.connection()
                await conn.execute(_RECORD.values(updated_at=now), changes)
                await conn.execute(insert(_ATTEMPTS), attempts)

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


async def _wait_any(stop: asyncio.Event, wake: asyncio.Event, seconds: float) -> None:
    waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
