"""Admission of a submit: ``Idempotency-Key`` replays and per-account limits.

Both are decided in the database, in the transaction that writes the task, so they hold
across any number of api processes: the idempotency row's primary key makes parallel
retries collide (one wins, the others replay its task), and the account's limit row is
locked while its token bucket is drawn and its tasks in flight are counted, so two submits
never both take the last slot. Submits that use neither keep the batched fast path.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from genhook.config import Settings
from genhook.data_urls import InlineData
from genhook.db import AccountLimit, Database, Task, wakeups
from genhook.db.driver import SessionTx
from genhook.db.upsert import upsert
from genhook.errors import Conflict, FieldError, InvalidRequest, TooManyRequests
from genhook.tasks.store import reads
from genhook.tasks.store.writes import drop_expired_key, insert_keys, insert_tasks, task_values

if TYPE_CHECKING:
    from genhook.tasks.submission import GroupInserter

IDEMPOTENCY_HEADER = "Idempotency-Key"
START_DEADLINE_HEADER = "X-Start-Deadline"
MAX_KEY_LENGTH = 255
MAX_START_DEADLINE_SECONDS = 86_400.0


def parse_idempotency_key(value: str | None) -> str | None:
    """1 to 255 printable ASCII characters, or a 400 naming the header."""
    if value is None:
        return None
    if not 1 <= len(value) <= MAX_KEY_LENGTH or not all(" " <= c <= "~" for c in value):
        message = f"must be 1 to {MAX_KEY_LENGTH} printable ASCII characters"
        raise InvalidRequest(
            f"invalid {IDEMPOTENCY_HEADER} header", [FieldError(IDEMPOTENCY_HEADER, message)]
        )
    return value


def parse_start_deadline(value: str | None) -> float | None:
    """Seconds from now by which the task must have started, or a 400 naming the header."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= MAX_START_DEADLINE_SECONDS:
        message = f"must be a number of seconds above 0 and at most {MAX_START_DEADLINE_SECONDS:g}"
        raise InvalidRequest(
            f"invalid {START_DEADLINE_HEADER} header", [FieldError(START_DEADLINE_HEADER, message)]
        )
    return seconds


def request_hash(path_name: str, body: Any, inline: InlineData | None = None) -> str:
    """The same submit sent twice hashes the same, whatever its key order; data URLs left
    in the body's bytes (``inline``) hash as the strings they are."""
    canonical = json.dumps(
        [path_name, body], sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    if inline is not None:
        return inline.digest(canonical)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class Limits:
    """Effective limits of one account; 0 means no limit."""

    per_second: float
    burst: int
    in_flight: int
    # The account's share of the workers (fair queuing, docs/scheduling.md): not a refusal.
    weight: int = 1

    @property
    def active(self) -> bool:
        return self.per_second > 0 or self.in_flight > 0

    @property
    def capacity(self) -> float:
        return float(self.burst or max(1, math.ceil(self.per_second)))


def effective_limits(settings: Settings, row: AccountLimit | None) -> Limits:
    def pick(override: Any, default: Any) -> Any:
        return default if override is None else override

    return Limits(
        per_second=float(
            pick(row and row.submits_per_second, settings.rate_limit_per_second) or 0.0
        ),
        burst=int(pick(row and row.submit_burst, settings.rate_limit_burst) or 0),
        in_flight=int(pick(row and row.max_in_flight, settings.max_tasks_in_flight) or 0),
        weight=int((row and row.weight) or 1),
    )


class Admission:
    def __init__(self, settings: Settings, db: Database, inserter: GroupInserter) -> None:
        self.settings = settings
        self.db = db
        # Keyed submits of unlimited accounts share the batched inserts of plain ones.
        self.inserter = inserter
        # Overrides change rarely (from the CLI); a short cache spares a read per submit.
        self._cache: dict[str, tuple[float, Limits]] = {}

    async def limits(self, account_id: str) -> Limits:
        ttl = self.settings.auth_cache_seconds
        cached = self._cache.get(account_id)
        if cached is not None and time.monotonic() - cached[0] < ttl:
            return cached[1]
        async with self.db.read() as session:
            row = await session.get(AccountLimit, account_id)
        limits = effective_limits(self.settings, row)
        if ttl > 0:
            self._cache[account_id] = (time.monotonic(), limits)
        return limits

    async def replay(self, account_id: str, key: str, digest: str, now: int) -> Task | None:
        """The task a live ``key`` created, or None; 409 when it came with another body."""
        async with self.db.read() as session:
            row = await reads.idempotency_key(session, account_id, key)
            if row is not None and row.expires_at > now:
                if row.request_hash != digest:
                    raise _key_conflict(key)
                return await reads.task_in(session, row.task_id)
        if row is not None:
            # Past its time: free the key for this request.
            async with self.db.write() as session:
                await drop_expired_key(session, account_id, key, now)
        return None

    async def insert(
        self,
        task: Task,
        blobs: list[dict[str, Any]],
        limits: Limits,
        key: str | None,
        digest: str,
        now: int,
    ) -> Task:
        """Write ``task`` under its key and its account's limits, or raise; returns the task
        to answer with (another request's, when that one holds the key).

        Without limits the rows join the batched insert; a batch that fails on a taken key
        is retried row by row, so only the duplicate fails, and it replays the winner.
        """
        keys: list[dict[str, Any]] = []
        if key is not None:
            ttl_ms = int(self.settings.idempotency_key_ttl_seconds * 1000)
            keys.append(
                {
                    "account_id": task.account_id,
                    "key": key,
                    "request_hash": digest,
                    "task_id": task.id,
                    "created_at": now,
                    "expires_at": now + ttl_ms,
                }
            )
        try:
            if not limits.active:
                await self.inserter.insert(task, blobs, keys)
                return task
            async with self.db.write() as session:
                tx = SessionTx(session)
                # The key first: a parallel retry waits here for this transaction's outcome.
                await insert_keys(tx, keys)
                await self._take_slot(session, task.account_id, limits, now)
                await self.inserter.fairness.tag(tx, [task], now)
                await insert_tasks(tx, [task_values(task)], blobs)
                await wakeups.notify(session, wakeups.TASKS)
        except IntegrityError:
            if key is None:
                raise
            existing = await self.replay(task.account_id, key, digest, now)
            if existing is None:
                raise
            return existing
        return task

    async def _take_slot(
        self, session: AsyncSession, account_id: str, limits: Limits, now: int
    ) -> None:
        """Lock the account's limit row, then check in-flight tasks and draw one token."""
        await session.execute(
            upsert(AccountLimit, postgres=self.db.is_postgres)
            .values(account_id=account_id, tokens=limits.capacity, tokens_at=now)
            .on_conflict_do_nothing(index_elements=[AccountLimit.account_id])
        )
        row = (
            await session.execute(
                select(AccountLimit.tokens, AccountLimit.tokens_at)
                .where(AccountLimit.account_id == account_id)
                .with_for_update()
            )
        ).one()
        if limits.in_flight > 0 and await reads.in_flight(session, account_id) >= limits.in_flight:
            raise TooManyRequests(
                f"this account has {limits.in_flight} task(s) in flight, its limit; "
                "submit again when one ends",
                [FieldError("tasks_in_flight", f"limit {limits.in_flight}")],
                retry_after=1,
            )
        if limits.per_second <= 0:
            return
        elapsed = max(0, now - int(row.tokens_at)) / 1000
        tokens = min(limits.capacity, float(row.tokens) + elapsed * limits.per_second)
        if tokens < 1:
            wait = (1 - tokens) / limits.per_second
            raise TooManyRequests(
                f"this account may submit {limits.per_second:g} task(s) per second; "
                f"retry in {wait:.2f} s",
                [FieldError("submits_per_second", f"limit {limits.per_second:g}")],
                retry_after=math.ceil(wait),
            )
        await session.execute(
            update(AccountLimit)
            .where(AccountLimit.account_id == account_id)
            .values(tokens=tokens - 1, tokens_at=now)
        )


def _key_conflict(key: str) -> Conflict:
    return Conflict(
        f"{IDEMPOTENCY_HEADER} {key!r} was already used with a different request; use a new "
        "key for a new request",
        [FieldError(IDEMPOTENCY_HEADER, "already used with a different request body")],
    )


async def set_account_limits(
    db: Database,
    account_id: str,
    *,
    per_second: float | None,
    burst: int | None,
    in_flight: int | None,
    clear: bool = False,
    weight: int | None = None,
) -> AccountLimit:
    """Store an account's overrides (None keeps the stored value; ``clear`` drops them all,
    the weight included)."""
    async with db.write() as session:
        await session.execute(
            upsert(AccountLimit, postgres=db.is_postgres)
            .values(account_id=account_id, tokens=0.0, tokens_at=0)
            .on_conflict_do_nothing(index_elements=[AccountLimit.account_id])
        )
        values: dict[str, Any] = {}
        if clear:
            values = {
                "submits_per_second": None,
                "submit_burst": None,
                "max_in_flight": None,
                "weight": None,
            }
        if per_second is not None:
            values["submits_per_second"] = per_second
        if burst is not None:
            values["submit_burst"] = burst
        if in_flight is not None:
            values["max_in_flight"] = in_flight
        if weight is not None:
            if weight < 1:
                raise ValueError("an account's weight is 1 or more")
            values["weight"] = weight
        if values:
            await session.execute(
                update(AccountLimit).where(AccountLimit.account_id == account_id).values(**values)
            )
        row = await session.get(AccountLimit, account_id, populate_existing=True)
        assert row is not None
        return row
