"""The attempt feed: the dispatcher's bookkeeping half, apart from its sending half.

The dispatcher's senders hand in finished attempts (``Outcome``) and ask for more; the feed
records the outcomes, claims the next due deliveries under a lease and signs them, all in
one exchange. ``LocalFeed`` does this in the dispatcher's own process. ``ProcessFeed`` runs
a ``LocalFeed`` in a helper process (``genhook.sender.feed_child``) and talks to it over a
pipe: the sending process then spends its event loop on HTTP alone, and the feed's database
and signing work runs on another core without waiting for that loop's GIL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import struct
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, NamedTuple, Protocol

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
# How long the helper process may take to start (imports, database connection).
START_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 10.0


class Attempt(NamedTuple):
    """A claimed delivery, signed and ready to send. Tuples cross the helper process's
    pipe cheaply."""

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
    # When the task ended, for a terminal event (the delivery's creation); for metrics.
    terminal_at: int | None = None


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


class AttemptFeed(Protocol):
    async def start(self) -> None:
        """Be ready for the first exchange (a failure here is retried by ``exchange``)."""
        ...

    async def exchange(
        self,
        outcomes: Sequence[Outcome],
        limit: int,
        rooms: Rooms = UNLIMITED,
        returned: Sequence[tuple[str, int]] = (),
    ) -> list[Attempt]:
        """Record ``outcomes``, give ``returned`` back unsent, then claim (within ``rooms``)
        and sign up to ``limit`` due deliveries."""
        ...

    async def close(self) -> None: ...


def attempt_feed(
    settings: Settings,
    db: Database,
    keyring: KeyRing,
    *,
    owner: str,
    lease_ms: int,
) -> AttemptFeed:
    if settings.webhook_feed_process:
        return ProcessFeed(settings, db, owner=owner, lease_ms=lease_ms)
    return LocalFeed(settings, db, keyring, owner=owner, lease_ms=lease_ms)


# -- in this process ----------------------------------------------------------------------


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
                c.created_at if c.event_type.endswith(".task.terminal") else None,
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
        if gives_up(settings, outcome, in_round):
            return "undeliverable", None, None
        cap = settings.webhook_retry_cap_seconds
        if outcome.retry_after is not None:
            delay = clamp(outcome.retry_after, RETRY_AFTER_MIN_SECONDS, cap)
        else:
            delay = backoff_delay(in_round, settings.webhook_retry_base_seconds, cap)
        return "pending", now + int(delay * 1000), None


def gives_up(settings: Settings, outcome: Outcome, in_round: int) -> bool:
    """Whether a failed attempt, number ``in_round`` of its round, ends its delivery."""
    return outcome.status_code == 410 or in_round >= settings.webhook_retry_max_attempts


# -- in a helper process ------------------------------------------------------------------

# Frames on the pipe: a 4-byte big-endian length, then a pickle. Only this package's
# helper process is ever on the other end.
_LENGTH = struct.Struct("!I")


def encode_frame(message: Any) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(data)) + data


async def read_frame(reader: asyncio.StreamReader) -> Any:
    (size,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    return pickle.loads(await reader.readexactly(size))  # noqa: S301 - our own child only


class FeedError(RuntimeError):
    """The helper process failed or went away; leases it held expire and are claimed again."""


class _Helper:
    """One helper process, the exchanges waiting on it, and the task reading its replies."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.pending: dict[int, asyncio.Future[list[Attempt]]] = {}
        self.reader = asyncio.create_task(self._read_replies())

    @property
    def alive(self) -> bool:
        return self.process.returncode is None and not self.reader.done()

    async def _read_replies(self) -> None:
        process = self.process
        assert process.stdout is not None
        try:
            while True:
                seq, ok, value = await read_frame(process.stdout)
                future = self.pending.pop(seq, None)
                if future is None or future.done():
                    continue
                if ok:
                    future.set_result([Attempt._make(row) for row in value])
                else:
                    future.set_exception(FeedError(value))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except Exception:
            log.exception("unreadable reply from webhook feed process %d; stopping it", process.pid)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        finally:
            code = await process.wait()
            if self.pending:
                log.error("webhook feed process %d exited (code %s)", process.pid, code)
            pending, self.pending = self.pending, {}
            for future in pending.values():
                if not future.done():
                    future.set_exception(FeedError("the webhook feed process exited"))


class ProcessFeed:
    """A ``LocalFeed`` in a helper process, started on first use and again after a crash.

    Requests are answered in order; several may be in flight. If the process dies, the
    exchanges waiting on it fail: their outcomes are not recorded, so those deliveries are
    sent again when their leases expire (delivery is at least once), and the next exchange
    starts a new process.
    """

    def __init__(self, settings: Settings, db: Database, *, owner: str, lease_ms: int) -> None:
        self.settings = settings
        self._init = (settings.model_dump_json(), db.url, owner, lease_ms)
        self._helper: _Helper | None = None
        self._seq = 0
        self._starting = asyncio.Lock()

    @property
    def pid(self) -> int | None:
        """The helper process's id while it runs."""
        helper = self._helper
        return helper.process.pid if helper is not None and helper.alive else None

    async def start(self) -> None:
        await self._started()

    async def exchange(
        self,
        outcomes: Sequence[Outcome],
        limit: int,
        rooms: Rooms = UNLIMITED,
        returned: Sequence[tuple[str, int]] = (),
    ) -> list[Attempt]:
        helper = await self._started()
        stdin = helper.process.stdin
        assert stdin is not None
        self._seq += 1
        seq = self._seq
        future: asyncio.Future[list[Attempt]] = asyncio.get_running_loop().create_future()
        helper.pending[seq] = future
        try:
            frame = (seq, [tuple(o) for o in outcomes], limit, tuple(rooms), list(returned))
            stdin.write(encode_frame(frame))
            await stdin.drain()
        except (ConnectionError, BrokenPipeError) as exc:
            helper.pending.pop(seq, None)
            raise FeedError("the webhook feed process is gone") from exc
        return await future

    async def _started(self) -> _Helper:
        async with self._starting:
            if self._helper is not None and self._helper.alive:
                return self._helper
            self._helper = _Helper(await self._spawn())
            return self._helper

    async def _spawn(self) -> asyncio.subprocess.Process:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            # Dies with this process even while it is still starting up.
            "genhook.lifeline",
            str(os.getpid()),
            "genhook.sender.feed_child",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=2**26,
        )
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(encode_frame(self._init))
        try:
            async with asyncio.timeout(START_TIMEOUT_SECONDS):
                await process.stdin.drain()
                reply = await read_frame(process.stdout)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError) as exc:
            await _end(process)
            raise FeedError(f"the webhook feed process did not start ({exc!r})") from exc
        if reply != ("ready",):
            await _end(process)
            raise FeedError(f"the webhook feed process did not start: {reply[1]}")
        log.info("webhook feed process %d started", process.pid)
        return process

    async def close(self) -> None:
        """End the process once it has answered what it was asked; the next exchange
        would start a new one."""
        helper, self._helper = self._helper, None
        if helper is not None:
            await _end(helper.process)
            await asyncio.gather(helper.reader, return_exceptions=True)


async def _end(process: asyncio.subprocess.Process) -> None:
    """Close the pipe (the process finishes its requests and exits), then make sure."""
    if process.stdin is not None:
        process.stdin.close()
    try:
        async with asyncio.timeout(STOP_TIMEOUT_SECONDS):
            await process.wait()
    except TimeoutError:
        log.error("webhook feed process %d did not stop; killing it", process.pid)
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
