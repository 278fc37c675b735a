"""Who is waiting on whom: per account, its tasks waiting and running now, its weight, and
its share of the worker time used over the last ``USAGE_WINDOW_SECONDS``.

For people, not for the claim: the console's queue page, ``GET /api/v1/queue`` (the
caller's own account), ``GET /api/v1/admin/queue`` and the per-account gauges of
``/metrics`` read it. The claim order itself is docs/scheduling.md's.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from genhook.db import Database, now_ms
from genhook.db.driver import SessionTx
from genhook.tasks.store.clocks import weights as account_weights
from genhook.tasks.store.reads import account_queues

# The recent window the usage share is measured over: long enough to hold several runs of
# a slow model (a minute of video), short enough to show a change of load within minutes.
USAGE_WINDOW_SECONDS = 900


@dataclass(frozen=True, slots=True)
class AccountShare:
    account_id: str
    weight: int
    waiting: int
    running: int
    # Worker time its tasks held in the window (runs still going count up to now).
    worker_seconds: float
    # Its part of all the worker time used in the window, 0 to 1 (0 when none was used).
    usage_share: float
    # Its weight over the weights of every account with a task waiting or running now: the
    # part of the workers fair queuing gives it while they all have work (0 when it has none).
    fair_share: float


@dataclass(frozen=True, slots=True)
class Shares:
    window_seconds: int
    measured_at: int  # epoch ms
    # Most waiting first, then most running, then most worker time.
    accounts: list[AccountShare]

    def of(self, account_id: str) -> AccountShare | None:
        return next((a for a in self.accounts if a.account_id == account_id), None)


async def measure(db: Database, *, window_seconds: int = USAGE_WINDOW_SECONDS) -> Shares:
    """Every account with work now or worker time in the window (one read transaction)."""
    now = now_ms()
    since = now - window_seconds * 1000
    async with db.read() as session:
        queues = await account_queues(session, since, now)
        weights = await account_weights(SessionTx(session), [q.account_id for q in queues])
    used = sum(q.worker_ms for q in queues)
    active = sum(weights[q.account_id] for q in queues if q.waiting or q.running)
    accounts = [
        AccountShare(
            account_id=q.account_id,
            weight=weights[q.account_id],
            waiting=q.waiting,
            running=q.running,
            worker_seconds=q.worker_ms / 1000,
            usage_share=q.worker_ms / used if used else 0.0,
            fair_share=weights[q.account_id] / active if q.waiting or q.running else 0.0,
        )
        for q in queues
    ]
    accounts.sort(key=lambda a: (-a.waiting, -a.running, -a.worker_seconds, a.account_id))
    return Shares(window_seconds, now, accounts)


async def idle_share(db: Database, account_id: str) -> AccountShare:
    """An account with nothing waiting, running or run in the window: its weight alone."""
    async with db.read() as session:
        weight = (await account_weights(SessionTx(session), [account_id]))[account_id]
    return AccountShare(account_id, weight, 0, 0, 0.0, 0.0, 0.0)


class RecentShares:
    """The last ``measure`` of a process, reused for ``max_age`` seconds: readers that any
    key may call (``GET /api/v1/queue``) cost at most one grouped read per ``max_age``,
    however often they are called; concurrent callers share one read."""

    def __init__(self, max_age: float = 2.0) -> None:
        self.max_age = max_age
        self._last: tuple[float, Shares] | None = None
        self._locks: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}

    async def get(self, db: Database) -> Shares:
        loop = asyncio.get_running_loop()
        if loop not in self._locks:
            self._locks = {loop: asyncio.Lock()}
        async with self._locks[loop]:
            if self._last is not None and time.monotonic() - self._last[0] < self.max_age:
                return self._last[1]
            shares = await measure(db)
            self._last = (time.monotonic(), shares)
            return shares
