"""Delivery workers: send signed attempts and report how they ended.

The dispatcher is the sending half. Its attempt feed (``genhook.sender.feed``) is the
other: it records outcomes, claims due deliveries under a lease and signs them, one write
transaction per batch, so any number of processes can dispatch from one database. Signed
attempts wait in a ready queue for a pool of sender tasks, and the next batch is asked for
while the current one is on the wire. An outcome is recorded only while its lease is still
held.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import aiohttp
from yarl import URL

from genhook import metrics, tracing
from genhook.config import Settings
from genhook.db import Database, now_ms
from genhook.logs import bind_delivery, unbind
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
from genhook.retry import backoff_delay, parse_retry_after
from genhook.sender.destinations import record_transitions
from genhook.sender.fairness import Fairness, Rooms, Route, Stop, is_health_failure
from genhook.sender.feed import LocalFeed
from genhook.sender.keys import KeyRing
from genhook.sender.queue import (
    UNLIMITED,
    Outcome,
    Outgoing,
    Ticked,
    earliest_pending,
    release_deliveries,
)

log = logging.getLogger(__name__)

# Extra lease time beyond the request timeout, for recording the outcome.
LEASE_MARGIN_SECONDS = 30.0
CLAIM_BATCH = 256
# Up to this many rounds of ``webhook_concurrency`` attempts are asked for ahead of the
# busy senders: enough that an exchange with the feed ends long before they run out.
READY_ROUNDS = 4
# Exchanges with the feed in flight at once.
MAX_EXCHANGES = 2
RECORD_DELAY_SECONDS = 0.2
# The soonest a dispatcher looks again after a claim that found too little, unless woken.
MIN_LOOK_SECONDS = 0.02
# How long the read of the next due time waits for attempts in flight: on the loop, the
# read would hold back the request an attempt is about to write.
READ_DEFER_SECONDS = 0.05
RETRY_AFTER_STATUSES = frozenset({429, 503})


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"


@lru_cache(maxsize=4096)
def _parse(url: str, allow_http: bool) -> Target:
    schemes = frozenset({"http", "https"}) if allow_http else frozenset({"https"})
    return _parse_target(url, schemes=schemes)


_classify = lru_cache(maxsize=4096)(classify)


@dataclass(frozen=True, slots=True, eq=False)
class _Ready:
    """A signed attempt whose target passed the check, waiting for a sender."""

    attempt: Outgoing
    url: URL
    session: aiohttp.ClientSession


def _route(job: _Ready) -> Route:
    return job.attempt.route


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
        self.owner = owner or default_owner()
        self._ssl = ssl_context or client_ssl_context(settings.webhook_ca_file)
        lease_ms = int((settings.webhook_timeout_seconds + lease_margin_seconds) * 1000)
        self.feed = LocalFeed(settings, db, keyring, owner=self.owner, lease_ms=lease_ms)
        self.fairness: Fairness[_Ready] = Fairness(
            settings,
            lease_seconds=lease_ms / 1000,
            ceiling=READY_ROUNDS * settings.webhook_concurrency,
        )
        self._health_writer: asyncio.Task[None] | None = None
        self._woken = False
        self._waiter: asyncio.Future[None] | None = None
        # False once a claim came back short: nothing more is due until a wake, or until
        # the poll interval has passed (retries fall due; other processes add deliveries).
        self._maybe_due = True
        self._short_at = 0.0
        # When to look again after a short claim (monotonic): the slow poll, or sooner when
        # the earliest scheduled retry falls due first (read once per short claim).
        self._next_look = 0.0
        self._due_unknown = False
        self._unknown_at = 0.0  # when _due_unknown was last set (monotonic)
        self._forgotten = 0  # _forget_next_due() calls so far
        self._look_is_poll = False
        self._wakes = 0  # wake() calls so far: one during a claim outdates its answer
        # Whether the last claim came back full: only then is a second one started while
        # one is in flight (an idle dispatcher polls with one claim at a time).
        self._full = False
        self._chunk = max(1, min(settings.webhook_concurrency // 4, CLAIM_BATCH))
        self._outcomes: list[Outcome] = []
        self._oldest_outcome = 0.0
        self._capacity = settings.webhook_concurrency
        self._excerpt_bytes = settings.webhook_response_excerpt_bytes
        self._ready: deque[_Ready] = deque()
        self._idle: deque[asyncio.Future[None]] = deque()
        self._busy = 0
        self._stopping = False
        self._asked = 0  # attempts asked of the feed and not yet answered
        self._exchanges: set[asyncio.Task[None]] = set()
        # Exchanges in flight that stop endpoints' deliveries (410 Gone): no other starts
        # meanwhile, so no claim can take a delivery the stop is about to end.
        self._stopping_endpoints = 0
        self._failed_at = -1.0
        self._https: aiohttp.ClientSession | None = None
        self._http: aiohttp.ClientSession | None = None
        # Set once sessions and the feed are ready (a feed that failed to start is retried).
        self.started = asyncio.Event()

    def wake(self) -> None:
        """Look for due deliveries now; safe to call at any time from the loop's thread."""
        self._maybe_due = True
        self._wakes += 1
        self._nudge()

    def _nudge(self) -> None:
        self._woken = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _sleep(self, timeout: float) -> None:
        """Until ``wake()``, ``_nudge()`` or ``timeout``; cheaper than events with tasks."""
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
            # The excerpt is stored as received, so no compressed answer is asked for; and
            # fewer headers are less work per attempt.
            skip_auto_headers=("Accept", "Accept-Encoding"),
        )

    async def open(self) -> None:
        self._https = self._session(require_private=False)
        if self.policy.allow_private:
            # Plain http is allowed only towards private addresses; a separate connector
            # enforces that at connect time.
            self._http = self._session(require_private=True)
        try:
            await self.feed.start()
        except Exception:
            log.exception("the webhook attempt feed did not start; retrying")
            self._failed_at = time.monotonic()
        self.started.set()

    async def close(self) -> None:
        for session in (self._https, self._http):
            if session is not None:
                await session.close()
        self._https = self._http = None
        await self.feed.close()

    # -- the loop ---------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Ask the feed for attempts and send them until ``stop`` is set; then let
        in-flight attempts finish.

        ``webhook_concurrency`` sender tasks take signed attempts from a ready queue that
        this loop keeps topped up: the next batch is asked for while the current one is on
        the wire, so senders do not wait for a transaction. Each exchange also hands in the
        attempts that ended; under load they go in chunks, since one write transaction per
        attempt would cost more than the sends themselves. Outcomes wait at most
        RECORD_DELAY_SECONDS for company.
        """
        await self.open()
        self._stopping = False
        poll = self.settings.webhook_poll_seconds
        senders = [asyncio.create_task(self._sender()) for _ in range(self._capacity)]
        stopping = asyncio.create_task(stop.wait())
        stopping.add_done_callback(lambda _: self._nudge())
        try:
            while not stop.is_set():
                if self.fairness.parked:
                    self._move_lines()
                if (
                    len(self._exchanges) < MAX_EXCHANGES
                    and not self._stopping_endpoints
                    and not self._backing_off()
                ):
                    want = self._want()
                    if want or self._record_due():
                        self._start_exchange(want)
                        continue
                # Look again at the earliest retry or one poll interval after the last claim
                # that found too little, whichever is first; a wake-up comes sooner.
                timeout = poll
                if not self._maybe_due:
                    # Outcomes still to record call for a read of their own once recorded.
                    if self._due_unknown and not self._outcomes:
                        deferred = time.monotonic() - self._unknown_at
                        if (self._busy or self._ready) and deferred < READ_DEFER_SECONDS:
                            # The attempts go out first; their outcomes, recorded when they
                            # end, call for this same read, so one read serves both.
                            await self._sleep(READ_DEFER_SECONDS - deferred)
                            continue
                        await self._read_next_due()
                        continue
                    timeout = max(0.001, self._next_look - time.monotonic())
                if self.fairness.parked:
                    due = self.fairness.probation_due - time.monotonic()
                    timeout = min(timeout, max(0.001, due))
                if self._outcomes:
                    due = self._oldest_outcome + RECORD_DELAY_SECONDS - time.monotonic()
                    timeout = min(timeout, max(0.001, due))
                await self._sleep(timeout)
        finally:
            stopping.cancel()
            # Attempts not started yet are given back by release_leases() below.
            while self._exchanges:
                await asyncio.gather(*self._exchanges, return_exceptions=True)
            self._stopping = True
            self._ready.clear()
            if self._health_writer is not None:
                await asyncio.gather(self._health_writer, return_exceptions=True)
            self._wake_senders(len(self._idle))
            await asyncio.gather(*senders, return_exceptions=True)
            if self._outcomes:
                outcomes, self._outcomes = self._outcomes, []
                await self._record_last(outcomes)
            await self.close()
            await self.release_leases()

    def _move_lines(self) -> None:
        """Send the held jobs that a first attempt leaving probation lets go."""
        freed = list(self.fairness.moved(_route))
        if freed:
            self._ready.extend(freed)
            self._wake_senders(len(freed))

    async def _record_last(self, outcomes: Sequence[Outcome]) -> None:
        """Record the outcomes left at stop, retrying with the shared backoff: a full disk or
        a database blip must not lose an acknowledgement (the delivery would be sent again
        once its lease runs out)."""
        started = time.monotonic()
        attempt = 0
        while True:
            try:
                await self.feed.exchange(outcomes, 0)
                return
            except Exception:
                attempt += 1
                delay = backoff_delay(attempt, 0.05, 1.0)
                if time.monotonic() - started + delay > self.settings.fault_retry_seconds:
                    log.exception("recording the last webhook attempts failed")
                    return
                log.warning("recording the last webhook attempts failed; retrying", exc_info=True)
                await asyncio.sleep(delay)

    def _forget_next_due(self) -> None:
        """The next due time must be read again (when first unknown: see READ_DEFER_SECONDS).
        A read in flight meanwhile is outdated: it may have begun before this change."""
        self._forgotten += 1
        if not self._due_unknown:
            self._unknown_at = time.monotonic()
            self._due_unknown = True

    def _backing_off(self) -> bool:
        return time.monotonic() - self._failed_at < 1.0

    def _want(self) -> int:
        """How many attempts to ask the feed for now. Up to READY_ROUNDS rounds are asked
        for ahead of the busy senders: an exchange hands work to another thread or process
        and back, and under load each hand-over waits for the loop to come round."""
        if not self._maybe_due:
            if self._due_unknown or time.monotonic() < self._next_look:
                return 0
            if self._look_is_poll:
                # The safety poll reads before it claims: an idle dispatcher writes nothing.
                self._short_at = time.monotonic()
                self._next_look = self._short_at + self.settings.webhook_poll_seconds
                self._forget_next_due()
                return 0
            self._maybe_due = True
        if self._asked and not self._full:
            return 0
        ahead = len(self._ready) + self._asked + self.fairness.parked
        room = READY_ROUNDS * self._capacity - self._busy - ahead
        if room >= self._chunk or (not self._busy and not ahead and room > 0):
            return min(room, CLAIM_BATCH)
        return 0

    def _record_due(self) -> bool:
        if self.fairness.returned or self.fairness.stops:
            return True
        # Idle too, an outcome waits for company: at a few deliveries a second the next claim
        # comes within the delay and records it in its own transaction, one write fewer.
        pending = len(self._outcomes)
        return pending >= self._chunk or (
            pending > 0 and time.monotonic() - self._oldest_outcome >= RECORD_DELAY_SECONDS
        )

    def _start_exchange(self, want: int) -> None:
        if self._claims_alone_now(want):
            outcomes: list[Outcome] = []
        else:
            outcomes, self._outcomes = self._outcomes, []
        fairness = self.fairness
        returned = [(job.attempt.id, due) for job, due in fairness.returned]
        fairness.returned = []
        stops, fairness.stops = fairness.stops, []
        self._stopping_endpoints += bool(stops)
        self._asked += want
        rooms = fairness.rooms() if want else UNLIMITED
        exchange = asyncio.create_task(self._exchange(outcomes, want, rooms, returned, stops))
        self._exchanges.add(exchange)
        exchange.add_done_callback(self._exchanges.discard)

    def _claims_alone_now(self, want: int) -> bool:
        """Whether this claim leaves the outcomes to a later exchange (``claims_alone``):
        only for an idle dispatcher woken for new work, which goes out sooner without them,
        and not while one of them holds back another event of its task. They wait
        RECORD_DELAY_SECONDS at most, as they would for company."""
        return (
            want > 0
            and self.feed.claims_alone
            and not self._busy
            and not self._ready
            and not any(outcome.holds_task for outcome in self._outcomes)
        )

    async def _exchange(
        self,
        outcomes: Sequence[Outcome],
        want: int,
        rooms: Rooms,
        returned: Sequence[tuple[str, int]],
        stops: Sequence[Stop] = (),
    ) -> None:
        wakes, forgotten = self._wakes, self._forgotten
        idle = not self._busy and not self._ready
        learned: Ticked | None = None
        read = False
        try:
            ticked = await self.feed.exchange(
                outcomes, want, rooms, returned, inline=idle, stops=stops
            )
            attempts, read = ticked.claimed, ticked.next_due_read
            if read and wakes == self._wakes and forgotten == self._forgotten:
                # Read in this exchange's transaction, after its writes: the read the
                # forgets below call for, unless a wake-up or another exchange meanwhile
                # outdated it.
                learned = ticked
        except Exception:
            # Keep the outcomes for the next exchange (after a pause): dropped, an
            # acknowledged delivery would be sent again when its lease expires. Recording
            # twice is harmless: an outcome is recorded only while its lease is ours.
            log.exception("webhook feed exchange failed; retrying")
            self._failed_at = time.monotonic()
            if outcomes:
                if not self._outcomes:
                    self._oldest_outcome = time.monotonic()
                self._outcomes[:0] = outcomes
            self.fairness.stops[:0] = stops
            attempts = []
        finally:
            self._asked -= want
            self._stopping_endpoints -= bool(stops)
        if outcomes or returned:
            self._forget_next_due()  # a retry may now be scheduled: read when it falls due
        if want:
            self._full = len(attempts) == want
            if not self._full and wakes == self._wakes:
                self._maybe_due = False
                self._short_at = time.monotonic()
                self._next_look = self._short_at + self.settings.webhook_poll_seconds
                self._look_is_poll = True
                if read or not attempts:
                    self._forget_next_due()
                # else a claim alone: recording its attempts' outcomes calls for the read
                # anyway, and one read serves both.
        if learned is not None:
            self._learn_next_due(learned.next_due)
        queued = 0
        for attempt in attempts:
            checked = self._check(attempt)
            if isinstance(checked, str):
                refused = _outcome(attempt, now_ms(), 0, None, checked, signed=False)
                metrics.webhook_attempted(attempt, refused, self.settings)
                self._finished(refused)
            else:
                job = _Ready(attempt, *checked)
                if self.fairness.admit(job, attempt.route):
                    self._ready.append(job)
                    queued += 1
        self._wake_senders(queued)
        self._nudge()

    async def _read_next_due(self) -> None:
        """Bring the next look forward to the earliest scheduled attempt (a read: an idle
        dispatcher writes nothing). Never sooner than MIN_LOOK_SECONDS after the short claim,
        so a due row that cannot be claimed yet (its room is full) is not spun on."""
        wakes, forgotten = self._wakes, self._forgotten
        try:
            earliest = await earliest_pending(self.db)
        except Exception:
            log.warning("reading the next webhook attempt time failed", exc_info=True)
            earliest = None
        if wakes != self._wakes:
            return  # woken meanwhile: a claim comes next anyway
        if forgotten == self._forgotten:
            self._learn_next_due(earliest)
        else:  # an outcome recorded meanwhile calls for another read; this one still counts
            self._look_by(earliest)

    def _learn_next_due(self, earliest: int | None) -> None:
        """The next due time is known again: ``earliest`` (epoch ms; None: nothing pending)."""
        self._due_unknown = False
        self._look_by(earliest)

    def _look_by(self, earliest: int | None) -> None:
        """Look again no later than ``earliest`` (and not sooner than MIN_LOOK_SECONDS after
        the last short claim)."""
        if earliest is not None:
            wait = (earliest - now_ms()) / 1000
            due = max(self._short_at + MIN_LOOK_SECONDS, time.monotonic() + wait)
            if wait <= 0 or due < self._next_look:
                self._next_look = due
                self._look_is_poll = False

    async def release_leases(self) -> None:
        """Make deliveries this process still holds due again at once (graceful stop)."""
        try:
            await release_deliveries(self.db, self.owner)
        except Exception:
            log.exception("releasing webhook leases failed; they expire on their own")

    # -- one attempt ------------------------------------------------------------------------

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
            context = bind_delivery(job.attempt)
            try:
                outcome = await self.send(job.attempt, job.url, job.session)
            except Exception as exc:  # never lose the lease silently on an unexpected error
                log.exception("webhook attempt for %s failed unexpectedly", job.attempt.id)
                outcome = _outcome(job.attempt, now_ms(), 0, None, f"internal error: {exc}")
            finally:
                self._busy -= 1
                unbind(context)
            metrics.webhook_attempted(job.attempt, outcome, self.settings)
            self._finished(self._released(job, outcome))

    def _released(self, job: _Ready, outcome: Outcome) -> Outcome:
        """Free ``job``'s share, move its endpoint's and host's health and send what may go
        now. The attempt log shows a probe and an attempt that opened a circuit."""
        route = job.attempt.route
        fairness = self.fairness
        before = fairness.state(route)
        freed = list(
            fairness.release(
                route,
                seconds=outcome.duration_ms / 1000,
                status_code=outcome.status_code,
                error=outcome.error,
                now_ms=outcome.started_at + outcome.duration_ms,
                key=_route,
                retry_after=outcome.retry_after,
            )
        )
        if freed:
            self._ready.extend(freed)
            self._wake_senders(len(freed))
        after = fairness.state(route)
        notes = []
        if "half_open" in before:
            notes.append("half-open probe")
        for was, now, name in zip(before, after, ("endpoint", "destination"), strict=True):
            if now == "open" and was != "open":
                notes.append(f"{name} circuit opened")
        if outcome.status_code == 410:
            notes.append("410 Gone: the endpoint's pending deliveries stop")
        if fairness.transitions:
            self._write_health()
        if notes:
            note = "; ".join(notes)
            failed = is_health_failure(outcome.status_code, outcome.error)
            outcome.error = f"{outcome.error} ({note})" if failed or outcome.error else note
        return outcome

    def _write_health(self) -> None:
        """Persist circuit changes for the API, one writer at a time, off the send path."""
        if self._health_writer is not None and not self._health_writer.done():
            return
        self._health_writer = asyncio.create_task(self._persist_health())

    async def _persist_health(self) -> None:
        while self.fairness.transitions:
            transitions, self.fairness.transitions = self.fairness.transitions, []
            try:
                await record_transitions(self.db, transitions)
            except Exception:
                log.exception("recording destination health failed")

    def _check(self, attempt: Outgoing) -> tuple[URL, aiohttp.ClientSession] | str:
        """The URL and session to send ``attempt`` with, or why its target is refused."""
        try:
            target = _parse(attempt.url, self.policy.allow_private)
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
        # Wake the loop only when there is something to do: a chunk of outcomes, room to
        # ask for more (the same test as _want), or nothing else in flight.
        ahead = len(self._ready) + self._asked + self.fairness.parked
        if (
            len(self._outcomes) >= self._chunk
            or READY_ROUNDS * self._capacity - self._busy - ahead >= self._chunk
            or not self._busy
        ):
            self._nudge()

    async def send(self, attempt: Outgoing, url: URL, session: aiohttp.ClientSession) -> Outcome:
        """One POST of the exact body bytes; a 3xx is a failure (redirects are not followed)."""
        if tracing.enabled():
            return await tracing.webhook_attempt(attempt, url, session, self._post)
        return await self._post(attempt, url, session)

    async def _post(
        self,
        attempt: Outgoing,
        url: URL,
        session: aiohttp.ClientSession,
        headers: dict[str, str] | None = None,
    ) -> Outcome:
        started = now_ms()
        clock = time.perf_counter()
        try:
            async with session.post(
                url, data=attempt.body, headers=headers or attempt.headers, allow_redirects=False
            ) as response:
                raw = await _read_up_to(response, self._excerpt_bytes)
                status = response.status
                retry_after = None
                if status in RETRY_AFTER_STATUSES:
                    retry_after = parse_retry_after(response.headers.get("Retry-After"))
                # Text columns (PostgreSQL) refuse NUL characters; receivers may send any bytes.
                excerpt = raw.decode("utf-8", errors="replace").replace("\x00", "\ufffd") or None
        except (TimeoutError, aiohttp.ClientError) as exc:
            elapsed = int((time.perf_counter() - clock) * 1000)
            return _outcome(attempt, started, elapsed, None, self._failure(exc))
        elapsed = int((time.perf_counter() - clock) * 1000)
        error = None
        if 300 <= status < 400:
            error = f"redirect not followed (HTTP {status})"
        elif not 200 <= status < 300:
            error = f"HTTP {status}"
        return _outcome(attempt, started, elapsed, status, error, excerpt, retry_after)

    def _failure(self, exc: TimeoutError | aiohttp.ClientError) -> str:
        """What the attempt log says about an attempt that got no answer."""
        if isinstance(exc, TimeoutError):
            return f"timeout after {self.settings.webhook_timeout_seconds:g} s"
        if isinstance(exc, aiohttp.ClientConnectorCertificateError):
            return "TLS certificate verification failed"
        if isinstance(exc, aiohttp.ClientConnectorError):
            if isinstance(exc.os_error, AddressRefused):
                return f"target refused: {exc.os_error.detail}"
            return f"connection failed: {exc.os_error.strerror or exc.os_error}"
        return f"{type(exc).__name__}: {exc}"


def _outcome(
    attempt: Outgoing,
    started_at: int,
    duration_ms: int,
    status_code: int | None,
    error: str | None,
    excerpt: str | None = None,
    retry_after: float | None = None,
    *,
    signed: bool = True,
) -> Outcome:
    """``signed`` is false for an attempt never sent: no key is recorded for it."""
    return Outcome(
        attempt.id,
        attempt.attempts,
        attempt.round_start,
        started_at,
        duration_ms,
        status_code,
        error,
        excerpt,
        attempt.kid if signed else None,
        retry_after,
        not attempt.terminal,
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


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
