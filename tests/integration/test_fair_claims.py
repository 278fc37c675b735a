"""Fair claim order across accounts (docs/scheduling.md), on SQLite and PostgreSQL: a
trickling account is not held behind another's flood, weights share the workers, worker
time actually used is what is charged, priorities order an account's own tasks, an account
alone takes every task, and a batch is filled in fair order. Claims are deterministic here:
tags come from the default estimate and a clock the test moves."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import select, update

from genhook.accounts import create_account
from genhook.db import AccountClock, Task, now_ms
from genhook.tasks import Lifecycle
from genhook.tasks import lifecycle as lifecycle_module
from genhook.tasks.admission import set_account_limits
from genhook.tasks.fairness import DEFAULT_COST_MS
from genhook.tasks.lifecycle import Completion
from tests.conftest import Harness, make_harness, make_settings
from tests.support.images import data_url

MODEL = "test/fake-edit"
# One task's estimated cost in virtual microseconds at weight 1 (no run times yet).
UNIT = DEFAULT_COST_MS * 1000


@pytest.fixture
async def fair(tmp_path: Path, database_url: str) -> AsyncIterator[Harness]:
    h = await make_harness(make_settings(tmp_path, database_url))
    yield h
    await h.client.aclose()
    await h.state.db.dispose()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The claims' and completions' time, in epoch ms, moved by the test."""
    now = [now_ms() + 10_000]  # ahead of every submit here, well before any deadline
    monkeypatch.setattr(lifecycle_module, "now_ms", lambda: now[0])
    return now


async def account(h: Harness, name: str) -> tuple[str, dict[str, str]]:
    created = await create_account(h.state.db, name)
    return created.account_id, {"Authorization": f"Bearer {created.api_key}"}


async def submit(h: Harness, headers: dict[str, str], count: int = 1) -> list[str]:
    ids = []
    for _ in range(count):
        body = {"model": MODEL, "prompt": "edit", "images": [data_url()], "size": "1024*1024"}
        response = await h.client.post("/api/v1/model/generateImage", json=body, headers=headers)
        assert response.status_code == 200, response.text
        ids.append(response.json()["id"])
    return ids


def lifecycle(h: Harness) -> Lifecycle:
    return Lifecycle(h.state.settings, h.state.db, h.state.storage)


async def claim(life: Lifecycle) -> Task | None:
    claimed = (await life.claim("w-fair", [MODEL])).tasks
    return claimed[0] if claimed else None


async def run(life: Lifecycle, clock: list[int], task: Task, held_ms: int) -> None:
    """The task holds the worker ``held_ms``, then completes."""
    clock[0] += held_ms
    assert await life.complete(task.id, "w-fair", outputs=[], nsfw=[], info={})


async def tags(h: Harness, ids: list[str]) -> dict[str, int]:
    async with h.state.db.read() as session:
        rows = await session.execute(select(Task.id, Task.fair_tag).where(Task.id.in_(ids)))
        return {task_id: tag for task_id, tag in rows}


async def test_a_trickling_account_is_claimed_next_behind_a_flood(
    fair: Harness, clock: list[int]
) -> None:
    _, a = await account(fair, "a")
    _, b = await account(fair, "b")
    flood = await submit(fair, a, 20)
    life = lifecycle(fair)
    first = await claim(life)
    assert first is not None and first.id == flood[0]
    (trickle,) = await submit(fair, b)
    second = await claim(life)
    assert second is not None and second.id == trickle  # not behind A's 19 others
    third = await claim(life)
    assert third is not None and third.id == flood[1]


async def test_the_oldest_task_goes_first_when_scheduling_is_fifo(
    tmp_path: Path, database_url: str
) -> None:
    h = await make_harness(make_settings(tmp_path, database_url, scheduling="fifo"))
    try:
        _, a = await account(h, "a")
        _, b = await account(h, "b")
        flood = await submit(h, a, 5)
        await submit(h, b)
        life = lifecycle(h)
        claimed = [await claim(life) for _ in range(5)]
        assert [task.id for task in claimed if task is not None] == flood
    finally:
        await h.client.aclose()
        await h.state.db.dispose()


async def test_weights_share_the_claims_three_to_one(fair: Harness, clock: list[int]) -> None:
    heavy, a = await account(fair, "a")
    _, b = await account(fair, "b")
    await set_account_limits(
        fair.state.db, heavy, per_second=None, burst=None, in_flight=None, weight=3
    )
    mine = set(await submit(fair, a, 9))
    await submit(fair, b, 3)
    life = lifecycle(fair)
    order: list[str] = []
    for _ in range(8):
        task = await claim(life)
        assert task is not None
        order.append("a" if task.id in mine else "b")
    # Tags: a at 0, 1/3, 2/3, 1, 4/3, 5/3 units; b at 0, 1: six of a's to two of b's.
    assert order.count("a") == 6 and order.count("b") == 2
    assert order[2:5] == ["a", "a", "a"] and order[5] == "b"


async def test_an_account_is_charged_the_worker_time_its_tasks_used(
    fair: Harness, clock: list[int]
) -> None:
    a_id, a = await account(fair, "a")
    b_id, b = await account(fair, "b")
    (slow,) = await submit(fair, a)
    await submit(fair, b)
    life = lifecycle(fair)
    for _ in range(2):
        task = await claim(life)
        assert task is not None
        await run(life, clock, task, 3 * DEFAULT_COST_MS if task.id == slow else DEFAULT_COST_MS)
    async with fair.state.db.read() as session:
        rows = await session.execute(select(AccountClock.account_id, AccountClock.used_ms))
        assert dict(rows.tuples().all()) == {a_id: 3 * DEFAULT_COST_MS, b_id: DEFAULT_COST_MS}
    # Both were charged one estimate at submit; a's clock now stands two units further on,
    # so b's next two tasks go before a's though a submitted first.
    await submit(fair, a, 2)
    early = await submit(fair, b, 2)
    claimed = [await claim(life) for _ in range(2)]
    assert [task.id for task in claimed if task is not None] == early


async def test_priorities_order_an_account_and_its_turns_stay_its_own(
    fair: Harness, clock: list[int]
) -> None:
    _, a = await account(fair, "a")
    first, second, urgent = await submit(fair, a, 3)
    async with fair.state.db.write() as session:
        await session.execute(update(Task).where(Task.id == urgent).values(priority=1))
    assert await tags(fair, [first, second, urgent]) == {first: 0, second: UNIT, urgent: 2 * UNIT}
    life = lifecycle(fair)
    claimed: list[Task] = []
    for _ in range(3):
        task = await claim(life)
        assert task is not None
        claimed.append(task)
    # The high one first, then the others oldest first; each claim takes the account's
    # next turn (its smallest tag), and the task it passed over takes the turn it left.
    assert [task.id for task in claimed] == [urgent, first, second]
    assert [task.fair_tag for task in claimed] == [0, UNIT, 2 * UNIT]
    assert await claim(life) is None


async def test_a_low_priority_task_waits_for_its_accounts_normal_ones(
    fair: Harness, clock: list[int]
) -> None:
    _, a = await account(fair, "a")
    later, *normal = await submit(fair, a, 3)
    async with fair.state.db.write() as session:
        await session.execute(update(Task).where(Task.id == later).values(priority=-1))
    life = lifecycle(fair)
    claimed = [await claim(life) for _ in range(3)]
    assert [task.id for task in claimed if task is not None] == [*normal, later]


async def test_an_account_alone_takes_every_task(fair: Harness, clock: list[int]) -> None:
    alone, a = await account(fair, "a")
    other, _ = await account(fair, "b")
    for account_id, weight in ((alone, 1), (other, 100)):
        await set_account_limits(
            fair.state.db, account_id, per_second=None, burst=None, in_flight=None, weight=weight
        )
    ids = await submit(fair, a, 5)
    life = lifecycle(fair)
    claimed = [await claim(life) for _ in range(5)]
    assert [task.id for task in claimed if task is not None] == ids
    assert await claim(life) is None


async def test_a_batch_is_filled_from_the_fair_head(fair: Harness, clock: list[int]) -> None:
    _, a = await account(fair, "a")
    _, b = await account(fair, "b")
    flood = await submit(fair, a, 6)
    trickle = await submit(fair, b, 2)
    life = lifecycle(fair)
    batch = await life.claim_more("w-fair", MODEL, 4)
    # Tags: a at 0, 1, 2 ... units, b at 0, 1: the four smallest are two of each.
    assert {task.id for task in batch} == {*flood[:2], *trickle}
    many = (await life.claim("w-fair", [MODEL], limits={MODEL: 2})).tasks
    assert {task.id for task in many} == set(flood[2:4])


async def test_the_members_of_a_batched_call_are_each_charged_their_share(
    fair: Harness, clock: list[int]
) -> None:
    a_id, a = await account(fair, "a")
    b_id, b = await account(fair, "b")
    await submit(fair, a)
    await submit(fair, b)
    life = lifecycle(fair)
    batch = await life.claim_more("w-fair", MODEL, 2)
    assert len(batch) == 2
    clock[0] += 2 * DEFAULT_COST_MS  # one call of both held the worker this long
    # As the worker records a batched call: each member's info names the call's size.
    items = [Completion(task.id, [], [], {"batch_size": 2}) for task in batch]
    assert await life.complete_many("w-fair", items) == [True, True]
    async with fair.state.db.read() as session:
        rows = await session.execute(
            select(AccountClock.account_id, AccountClock.used_ms, AccountClock.finish)
        )
        clocks = {account_id: (used, finish) for account_id, used, finish in rows}
    # Each was charged half the call, one estimate: its clock stands where submit left it.
    assert clocks == {a_id: (DEFAULT_COST_MS, UNIT), b_id: (DEFAULT_COST_MS, UNIT)}


async def test_a_canceled_waiting_task_gives_its_turn_back(fair: Harness, clock: list[int]) -> None:
    a_id, a = await account(fair, "a")
    ids = await submit(fair, a, 3)
    for task_id in ids[1:]:
        response = await fair.client.post(f"/api/v1/model/result/{task_id}/cancel", headers=a)
        assert response.status_code == 200, response.text
    async with fair.state.db.read() as session:
        row = await session.get(AccountClock, a_id)
        assert row is not None and row.finish == UNIT  # only the one still waiting


async def test_queue_positions_follow_the_fair_order(fair: Harness, clock: list[int]) -> None:
    _, a = await account(fair, "a")
    _, b = await account(fair, "b")
    flood = await submit(fair, a, 5)
    assert await claim(lifecycle(fair)) is not None  # a's first runs
    (trickle,) = await submit(fair, b)

    async def position(task_id: str, headers: dict[str, str]) -> int:
        response = await fair.client.get(f"/api/v1/model/result/{task_id}", headers=headers)
        assert response.status_code == 200, response.text
        value: int = response.json()["queue_position"]
        return value

    assert await position(trickle, b) == 0
    assert await position(flood[-1], a) == 4  # a's three before it, and b's
