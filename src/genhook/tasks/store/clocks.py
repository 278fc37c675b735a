"""Statements of fair queuing (``tasks/fairness.py`` decides; docs/scheduling.md): the
queue's virtual time, the accounts' weights and clocks, and what a task's end corrects.

Each runs in the caller's transaction: the submit's insert (``tag``), the terminal
transition (``charge``). An account's clock row is locked by the statement that moves it,
so concurrent submits and completions of one account take turns on it; every caller moves
its accounts' clocks in account order, so two transactions never wait on each other's rows
crosswise.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any, cast

from sqlalchemy import BigInteger, Executable, Table, bindparam, case, func, select, update

from genhook.db import AccountClock, AccountLimit, Task
from genhook.db.driver import Tx
from genhook.db.upsert import upsert
from genhook.statuses import TaskStatus
from genhook.tasks.store.hot_path import keys_params

_tasks = cast(Table, Task.__table__)
_clocks = cast(Table, AccountClock.__table__)
_limits = cast(Table, AccountLimit.__table__)

# The statuses of tasks that were claimed: the largest tag among them is the queue's virtual
# time (start-time fair queuing: the tag of the work in service). Each is one probe of
# ``ix_tasks_status_tag`` from its end. Canceled and timed-out tasks may never have started.
_STARTED = (TaskStatus.PROCESSING, TaskStatus.COMPLETED, TaskStatus.FAILED)
VIRTUAL_TIME = select(
    *(
        select(func.max(_tasks.c.fair_tag))
        .where(_tasks.c.status == status)
        .scalar_subquery()
        .label(f"started_{index}")
        for index, status in enumerate(_STARTED)
    )
)

# How far back the run times of a model's tasks are read for its cost estimate: an index
# range of ``ix_tasks_finished``, bounded whatever the history holds.
RECENT_MS = 3_600_000
RECENT_RUNS = 20
_run_ms = (_tasks.c.finished_at - _tasks.c.started_at).label("run_ms")
RUN_TIMES = (
    select(_run_ms)
    .where(
        _tasks.c.finished_at > bindparam("since", type_=BigInteger),
        _tasks.c.model == bindparam("model"),
        _tasks.c.status == TaskStatus.COMPLETED,
        _tasks.c.started_at.is_not(None),
    )
    .order_by(_tasks.c.finished_at.desc())
    .limit(RECENT_RUNS)
)


async def virtual_time(tx: Tx) -> int:
    row = await tx.first(VIRTUAL_TIME, {})
    return max((int(value) for value in (row or {}).values() if value is not None), default=0)


async def recent_run_ms(tx: Tx, model: str, now: int) -> list[int]:
    """How long the model's latest completed tasks held their worker, newest first."""
    rows = await tx.rows(RUN_TIMES, {"model": model, "since": now - RECENT_MS})
    return [int(row["run_ms"]) for row in rows]


@functools.lru_cache(maxsize=64)
def _weights(count: int) -> Executable:
    account = _limits.c.account_id
    if count == 1:
        which = account == bindparam("account_0")
    else:
        which = account.in_([bindparam(f"account_{i}") for i in range(count)])
    return select(account, _limits.c.weight).where(which)


async def weights(tx: Tx, accounts: Sequence[str]) -> dict[str, int]:
    """Each account's weight; 1 where none is set."""
    rows = await tx.rows(_weights(len(accounts)), keys_params(accounts, "account"))
    found = {row["account_id"]: row["weight"] for row in rows}
    return {account: max(1, int(found.get(account) or 1)) for account in accounts}


@functools.cache
def _advance(postgres: bool) -> Executable:
    """Move an account's clock to ``max(its finish, :v) + :total`` and return the new
    finish; the row is made at the account's first task."""
    v = bindparam("v", type_=BigInteger)
    total = bindparam("total", type_=BigInteger)
    now = bindparam("now", type_=BigInteger)
    statement = upsert(_clocks, postgres=postgres).values(
        account_id=bindparam("account"), finish=v + total, used_ms=0, updated_at=now
    )
    return statement.on_conflict_do_update(
        index_elements=[_clocks.c.account_id],
        set_={
            "finish": case((_clocks.c.finish > v, _clocks.c.finish), else_=v) + total,
            "updated_at": now,
        },
    ).returning(_clocks.c.finish)


async def advance(tx: Tx, account: str, v: int, total: int, now: int, *, postgres: bool) -> int:
    """The start of the account's next ``total`` of virtual time (its tasks' first tag)."""
    row = await tx.first(
        _advance(postgres), {"account": account, "v": v, "total": total, "now": now}
    )
    assert row is not None
    return int(row["finish"]) - total


# A task's end: the account is charged what its tasks held their workers for, in place of
# what was charged at submit; ``:used_us // weight`` is that time in virtual time.
_weight_of = func.coalesce(
    select(_limits.c.weight).where(_limits.c.account_id == _clocks.c.account_id).scalar_subquery(),
    1,
)
CORRECT = (
    update(_clocks)
    .where(_clocks.c.account_id == bindparam("account"))
    .values(
        finish=_clocks.c.finish
        + bindparam("used_us", type_=BigInteger) // _weight_of
        - bindparam("charged", type_=BigInteger),
        used_ms=_clocks.c.used_ms + bindparam("used_ms", type_=BigInteger),
        updated_at=bindparam("now", type_=BigInteger),
    )
)


async def correct(tx: Tx, ended: Iterable[Any], now: int) -> None:
    """Charge the accounts of ``ended`` tasks (Tasks or rows) their worker time: from the
    claim to the end (nothing for a task that never started), less the estimate charged at
    submit. A task requeued after a lost lease is charged only for its last run. A member of
    a batched call is charged its share: its time divided by the number of tasks in the
    call (``info["batch_size"]``, as the worker records it with the outputs)."""
    per_account: dict[str, tuple[int, int]] = {}
    for task in ended:
        used = 0
        if task.started_at is not None and task.finished_at is not None:
            used = max(0, int(task.finished_at) - int(task.started_at)) // _sharing(task)
        ms, charged = per_account.get(task.account_id, (0, 0))
        per_account[task.account_id] = (ms + used, charged + int(task.fair_cost or 0))
    for account in sorted(per_account):
        used, charged = per_account[account]
        params = {
            "account": account,
            "used_us": used * 1000,
            "used_ms": used,
            "charged": charged,
            "now": now,
        }
        await tx.run(CORRECT, params)


def _sharing(task: Any) -> int:
    """How many tasks shared the call that ran ``task`` (1 unless it ran in a batch)."""
    info = task.info
    size = info.get("batch_size") if isinstance(info, dict) else None
    return size if isinstance(size, int) and size > 1 else 1
