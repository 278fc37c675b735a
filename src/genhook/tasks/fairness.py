"""Fair sharing of the workers across accounts: start-time fair queuing with tags
(docs/scheduling.md).

Every task gets a virtual start tag at submit: ``max(its account's virtual finish, the
queue's virtual time)``, and the account's finish moves on by the task's estimated worker
time divided by the account's weight. Workers claim the smallest tag first (one ORDER BY on
an index, like the oldest-first claim), so each account backlogged gets a share of the
workers in proportion to its weight, and an account alone gets them all. The estimate is
the model's recent mean run time; when a task ends, its account's clock is corrected by what
the task really held its worker for, so the shares are of worker time actually used.

Tags are given whatever ``GENHOOK_SCHEDULING`` says, so switching between ``fair`` and
``fifo`` needs nothing but a restart of the workers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from genhook.db import Task
from genhook.db.driver import Tx
from genhook.tasks.store import clocks

__all__ = [
    "DEFAULT_COST_MS",
    "DEFAULT_TTL_SECONDS",
    "ESTIMATE_TTL_SECONDS",
    "PRIORITIES",
    "Fairness",
]

# A model's cost before any of its tasks has completed within the last hour.
DEFAULT_COST_MS = 1000
# How long a process keeps a model's estimate before reading it again; the default of a
# model without recent run times only briefly, so its first runs count soon.
ESTIMATE_TTL_SECONDS = 30.0
DEFAULT_TTL_SECONDS = 1.0
# The priorities a task may have, by the name the API speaks; an account's own waiting tasks
# go highest first, oldest first within one.
PRIORITIES = {"high": 1, "normal": 0, "low": -1}


@dataclass
class Fairness:
    """Tags new tasks, in the transaction that inserts them."""

    postgres: bool
    # model -> (monotonic time it is read again, mean run ms)
    _estimates: dict[str, tuple[float, int]] = field(default_factory=dict)

    async def cost_ms(self, tx: Tx, model: str, now: int) -> int:
        """The estimated worker time of one task of ``model``: the mean of its latest run
        times, read at most every ``ESTIMATE_TTL_SECONDS``."""
        cached = self._estimates.get(model)
        if cached is not None and time.monotonic() < cached[0]:
            return cached[1]
        runs = await clocks.recent_run_ms(tx, model, now)
        estimate = max(1, sum(runs) // len(runs)) if runs else DEFAULT_COST_MS
        ttl = ESTIMATE_TTL_SECONDS if runs else DEFAULT_TTL_SECONDS
        self._estimates[model] = (time.monotonic() + ttl, estimate)
        return estimate

    async def tag(self, tx: Tx, tasks: Sequence[Task], now: int) -> None:
        """Give each of ``tasks`` its start tag and the virtual time charged for it, in
        submit order within each account, and move the accounts' clocks on."""
        if not tasks:
            return
        accounts = sorted({task.account_id for task in tasks})
        weight = await clocks.weights(tx, accounts)
        v = await clocks.virtual_time(tx)
        costs: dict[str, list[tuple[Task, int]]] = {account: [] for account in accounts}
        for task in tasks:
            cost = await self.cost_ms(tx, task.model, now) * 1000 // weight[task.account_id]
            costs[task.account_id].append((task, max(1, cost)))
        for account in accounts:  # account order: see tasks/store/clocks.py
            charged = costs[account]
            total = sum(cost for _, cost in charged)
            start = await clocks.advance(tx, account, v, total, now, postgres=self.postgres)
            for task, cost in charged:
                task.fair_tag = start
                task.fair_cost = cost
                start += cost
