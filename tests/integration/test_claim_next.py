"""A worker that knows another task waits completes its task and claims the next in one
write transaction (one turn of SQLite's write lock, not two), on SQLite and PostgreSQL; a
stop, or a combined transaction that fails, leaves no task claimed and not run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from genhook.db import Task, UsageLine, WebhookDelivery
from genhook.tasks.lifecycle import Claim, Completion
from tests.conftest import QUIET_KEEPER, Harness, make_harness, make_settings
from tests.integration.test_hot_path import counting, submit, writes
from tests.support.engines import BATCH_MODEL

HOOK = "http://127.0.0.1:9/hook"


@pytest.fixture
async def quiet(tmp_path: Path, database_url: str) -> AsyncIterator[Harness]:
    """A harness whose worker neither polls, heartbeats nor checks for cancels while a test
    counts its transactions: what it writes is its claims and completions."""
    settings = make_settings(tmp_path, database_url, worker_poll_seconds=5.0, **QUIET_KEEPER)
    h = await make_harness(settings)
    yield h
    await h.client.aclose()
    await h.state.db.dispose()


async def states(h: Harness, ids: Sequence[str]) -> dict[str, tuple[str, str | None, int]]:
    async with h.state.db.read() as session:
        rows = await session.execute(
            select(Task.id, Task.status, Task.lease_owner, Task.lease_losses).where(
                Task.id.in_(ids)
            )
        )
        return {task_id: (status, owner, losses) for task_id, status, owner, losses in rows}


async def billed_and_called_back(h: Harness, ids: Sequence[str]) -> tuple[int, dict[str, int]]:
    """Usage lines of ``ids``, and terminal callbacks enqueued per task."""
    async with h.state.db.read() as session:
        usage = await session.scalar(select(func.count()).where(UsageLine.task_id.in_(ids)))
        rows = await session.execute(
            select(WebhookDelivery.task_id, func.count())
            .where(
                WebhookDelivery.task_id.in_(ids),
                WebhookDelivery.event_type.not_like("%.task.processing"),
            )
            .group_by(WebhookDelivery.task_id)
        )
        return int(usage or 0), {task_id: count for task_id, count in rows}


async def run_until(
    h: Harness, stop: asyncio.Event, done: Callable[[], Awaitable[None]] | None = None
) -> None:
    """Run the worker until ``stop``, which the worker's path or ``done()`` sets."""
    running = asyncio.create_task(h.worker.run(stop))
    try:
        async with asyncio.timeout(30):
            while not stop.is_set():
                await asyncio.sleep(0.02)
                if done is not None:
                    await done()
    finally:
        stop.set()
        await running


async def test_a_queue_costs_one_write_transaction_per_task_after_the_first_claim(
    quiet: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h, count = quiet, 5
    ids = [await submit(h, webhook_url=HOOK) for _ in range(count)]
    worker, stop = h.worker, asyncio.Event()
    plain = worker.lifecycle.complete_many

    async def last_completion(owner: str, items: Sequence[Completion]) -> list[bool]:
        # The last task, with nothing left behind it, is completed on its own.
        done = await plain(owner, items)
        if [item.task_id for item in items] == ids[-1:]:
            stop.set()
        return done

    monkeypatch.setattr(worker.lifecycle, "complete_many", last_completion)
    with counting(h.state.db) as seen:
        await run_until(h, stop)
    # The first claim, then per task one transaction: its completion with the next claim,
    # and for the last one its completion alone.
    assert seen["tx"] == count + 1
    # Each task claimed once and completed once, and its account charged its worker time.
    assert writes(seen, h) == 3 * count
    assert set((await states(h, ids)).values()) == {("completed", None, 0)}
    usage, callbacks = await billed_and_called_back(h, ids)
    assert usage == count
    assert callbacks == {task_id: 1 for task_id in ids}


async def test_a_stop_during_a_task_claims_no_successor(
    quiet: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = quiet
    first, *rest = [await submit(h) for _ in range(3)]
    worker, stop = h.worker, asyncio.Event()
    store = worker.store_outputs

    async def stop_then_store(*args: Any) -> list[str]:
        stop.set()  # a SIGTERM while the engine runs: this task finishes, nothing more
        return await store(*args)

    monkeypatch.setattr(worker, "store_outputs", stop_then_store)
    with counting(h.state.db) as seen:
        await run_until(h, stop)
    # Its claim and its completion (and its account's charge) alone: no successor claimed.
    assert (seen["tx"], writes(seen, h)) == (2, 3)
    assert await states(h, [first, *rest]) == {
        first: ("completed", None, 0),
        **{task_id: ("created", None, 0) for task_id in rest},
    }


async def test_a_task_claimed_with_a_completion_is_released_when_the_worker_stops(
    quiet: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = quiet
    ids = [await submit(h) for _ in range(3)]
    worker, stop = h.worker, asyncio.Event()
    claim = worker.lifecycle.claim

    async def stop_after(*args: Any, **kwargs: Any) -> Claim:
        outcome = await claim(*args, **kwargs)
        if kwargs.get("complete"):
            stop.set()  # after the commit that claimed the next task, before the loop runs it
        return outcome

    monkeypatch.setattr(worker.lifecycle, "claim", stop_after)
    await run_until(h, stop)
    assert await states(h, ids) == {
        ids[0]: ("completed", None, 0),
        ids[1]: ("created", None, 0),  # given back unharmed: no lost lease counted
        ids[2]: ("created", None, 0),
    }
    assert not worker.prefetched


@pytest.mark.parametrize("committed", [False, True], ids=["rolled-back", "reply-lost"])
async def test_a_failed_combined_transaction_completes_each_task_once_and_loses_none(
    quiet: Harness, monkeypatch: pytest.MonkeyPatch, committed: bool
) -> None:
    """A fault in the combined transaction is retried as the plain completion. When its
    commit did happen (only the reply was lost), the task it claimed is given back."""
    h, count = quiet, 4
    ids = [await submit(h, webhook_url=HOOK) for _ in range(count)]
    worker, stop = h.worker, asyncio.Event()
    claim = worker.lifecycle.claim
    calls: list[int] = []

    async def faulty(*args: Any, **kwargs: Any) -> Claim:
        if not kwargs.get("complete"):
            return await claim(*args, **kwargs)
        calls.append(1)
        if committed:
            await claim(*args, **kwargs)
        raise ConnectionResetError("connection lost")

    async def all_completed() -> None:
        if {status for status, _, _ in (await states(h, ids)).values()} == {"completed"}:
            stop.set()

    monkeypatch.setattr(worker.lifecycle, "claim", faulty)
    await run_until(h, stop, all_completed)
    assert calls  # the combined transaction was tried
    assert set((await states(h, ids)).values()) == {("completed", None, 0)}
    usage, callbacks = await billed_and_called_back(h, ids)
    assert usage == count
    assert callbacks == {task_id: 1 for task_id in ids}


async def test_a_claim_with_a_completion_ends_the_items_then_claims_as_a_plain_claim(
    harness: Harness,
) -> None:
    first, second, third = [await submit(harness) for _ in range(3)]
    lifecycle, model = harness.worker.lifecycle, "test/fake-edit"
    claim = await lifecycle.claim("w-1", [model])
    assert [task.id for task in claim.tasks] == [first] and claim.more
    inputs: dict[str, dict[str, bytes]] = {}
    item = Completion(first, [], [], {"n": 1})
    with counting(harness.state.db) as seen:
        claim = await lifecycle.claim("w-1", [model], inputs=inputs, complete=[item])
    assert claim.done == [True] and [task.id for task in claim.tasks] == [second] and claim.more
    assert list(inputs) == [second] and len(inputs[second]) == 1  # its input image, read too
    # The completion's UPDATE, blob DELETE, usage INSERT and the account's charge; the
    # claim's UPDATE (the fair claim), its input image and the look on: one transaction.
    assert writes(seen, harness) == 3
    rest = {k: n for k, n in seen.items() if k not in ("UPDATE", "WITH")}
    assert rest == {"tx": 1, "DELETE": 1, "INSERT": 1, "SELECT": 2}
    claim = await lifecycle.claim("w-1", [model], complete=[Completion(second, [], [], {})])
    assert claim.done == [True] and [task.id for task in claim.tasks] == [third]
    assert not claim.more
    lifecycle.closed = True  # a worker leaving at once completes, and takes nothing more
    claim = await lifecycle.claim("w-1", [model], complete=[Completion(third, [], [], {})])
    assert claim == Claim([], False, [True])
    assert set((await states(harness, [first, second, third])).values()) == {("completed", None, 0)}


async def test_a_queue_of_batches_records_each_batch_with_the_next_claim(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batched model's slot records a batch's completions with the claim of its next batch,
    as a lone task's slot does: one write transaction per batch after the first claim."""
    from tests.integration.test_batching import batching
    from tests.integration.test_batching import submit as submit_batched

    quiet = dict(worker_poll_seconds=5.0, **QUIET_KEEPER)
    async with batching(tmp_path, database_url, size=4, **quiet) as h:
        ids = [await submit_batched(h) for _ in range(12)]
        worker, stop = h.worker, asyncio.Event()
        claim, plain = worker.lifecycle.claim, worker.lifecycle.complete_many
        claims: list[tuple[int, int]] = []  # (completions recorded, tasks taken)
        alone: list[int] = []

        async def stop_when_drained(*args: Any, **kwargs: Any) -> Claim:
            claimed = await claim(*args, **kwargs)
            if BATCH_MODEL in args[1]:  # not the claims of other models' slots
                claims.append((len(kwargs.get("complete", ())), len(claimed.tasks)))
            if kwargs.get("complete") and not claimed.tasks:
                stop.set()  # the last batch's completions, with a claim that found nothing
            return claimed

        async def complete_alone(owner: str, items: Sequence[Completion]) -> list[bool]:
            alone.append(len(items))
            return await plain(owner, items)

        monkeypatch.setattr(worker.lifecycle, "claim", stop_when_drained)
        monkeypatch.setattr(worker.lifecycle, "complete_many", complete_alone)
        await run_until(h, stop)
        assert claims == [(0, 4), (4, 4), (4, 4), (4, 0)] and not alone
        assert set((await states(h, ids)).values()) == {("completed", None, 0)}
        usage, _ = await billed_and_called_back(h, ids)
        assert usage == len(ids)
