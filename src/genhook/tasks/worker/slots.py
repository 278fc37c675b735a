"""Slots: the worker's loop when a model runs several calls at once in one process.

Used when a model's ``ModelSpec.concurrency`` is above 1: an I/O-bound ``AsyncEngine``'s
tasks on the loop, or a thread-safe synchronous engine's calls in threads. Models of
concurrency 1 still share one slot, so they run one at a time in a thread exactly as in
``Worker.run``. A model's free slots are claimed in one transaction, which also reads the
batch's input images, so the database work per task stays small when hundreds of tasks a
second go through one process. A batched model's slot holds a whole batch (one call).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from genhook.db.wakeups import Wake

if TYPE_CHECKING:
    from genhook.db import Task
    from genhook.tasks.worker.loop import Worker

log = logging.getLogger(__name__)

# Most tasks one claim takes for a model, so one claim never holds the loop long.
CLAIM_BATCH = 32
# While a model's queue has work, its slots are claimed in batches of at least its limit
# divided by this (8 of 64): a claim per finished task would cost a transaction per task.
CLAIM_BATCH_DIVISOR = 8


async def run_concurrent(worker: Worker, stop: asyncio.Event) -> None:
    """Claim while a model has a free slot, until ``stop``; tasks in hand finish first."""
    running: dict[asyncio.Future[None], str] = {}
    # When a group's last claim found its queue empty (loop time); it is asked again only
    # after ``worker_poll_seconds``, not each time one of the other tasks finishes.
    idle_since: dict[tuple[str, ...], float] = {}
    loop = asyncio.get_running_loop()
    stopping = asyncio.ensure_future(stop.wait())
    waited = False
    try:
        while not stop.is_set() and not worker.tainted:
            poll = worker.idle_poll()
            for finished in [job for job in running if job.done()]:
                _reap(running, finished)
            claimed = False
            for models, free in _free_slots(worker.limits, list(running.values())):
                group = tuple(models)
                if loop.time() - idle_since.get(group, float("-inf")) < poll:
                    continue
                if group not in idle_since and free < _min_batch(worker.limits, models):
                    continue  # a busy queue: wait for more free slots, then take a batch
                if waited and not running and not await _any_runnable(worker, models):
                    idle_since[group] = loop.time()
                    continue  # after a wait, read first: an idle worker writes nothing
                if not await worker.storage_ready():
                    idle_since[group] = loop.time()
                    continue  # outputs cannot be stored now: claim nothing
                try:
                    batches = await _claim(worker, models, free)
                except Exception:
                    log.exception("worker %s: claim failed; retrying", worker.worker_id)
                    batches = []
                if len(batches) < free:
                    idle_since[group] = loop.time()
                else:
                    idle_since.pop(group, None)
                for tasks in batches:
                    running[asyncio.ensure_future(worker.run_claimed(tasks, stop))] = tasks[0].model
                claimed = claimed or bool(batches)
            if claimed:
                waited = False
                continue
            # Idle (a writer may take it alone) only with a slot free for what it is sent.
            # Not alone either when it would hold a task back for another worker (affinity).
            free = bool(_free_slots(worker.limits, list(running.values()))) and not worker.hold_ms()
            waking = asyncio.ensure_future(worker.wakeup.wait(poll, idle=free))
            waiters: set[asyncio.Future[Any]] = {stopping, waking, *running}
            await asyncio.wait(waiters, return_when="FIRST_COMPLETED")
            waited = True
            if waking.done() and not waking.cancelled():
                wake = waking.result()
                if wake is not Wake.TIMEOUT:
                    idle_since.clear()  # woken: a task may be waiting now, ask every queue
                # Sent a task alone: claim it without reading first.
                waited = wake is not Wake.TARGETED
            waking.cancel()
        if running:
            await asyncio.wait(running)
    finally:
        stopping.cancel()


async def _claim(worker: Worker, models: list[str], free: int) -> list[list[Task]]:
    """Work for ``free`` slots of ``models``: a task each, or a batch each for a batched
    model (its first task and up to its batch size less one more of its model)."""
    lifecycle, owner = worker.lifecycle, worker.worker_id
    terms: dict[str, Any] = dict(
        reserve_ms=worker.reserve_ms(),
        inputs=worker.prefetched,
        hold_ms=worker.hold_ms(),
        affinity=worker.preference(),
        look_on=False,
    )
    if len(models) == 1 and models[0] not in worker.batch_sizes:
        # A model's free slots in one claim, a task each.
        claim = await lifecycle.claim(owner, models, limits={models[0]: free}, **terms)
        return [[task] for task in claim.tasks]
    batches = []
    for _ in range(free):
        claim = await lifecycle.claim(owner, models, limits=worker.batch_sizes, **terms)
        if not claim.tasks:
            break
        batches.append(claim.tasks)
    return batches


async def _any_runnable(worker: Worker, models: list[str]) -> bool:
    try:
        return await worker.lifecycle.any_runnable(models, hold_ms=worker.hold_ms())
    except Exception:
        return True  # let the claim report the fault


def _free_slots(limits: dict[str, int], running: list[str]) -> list[tuple[list[str], int]]:
    """(models, how many) to claim: CPU models together for one slot, others each their own."""
    counts: dict[str, int] = {}
    for model in running:
        counts[model] = counts.get(model, 0) + 1
    groups: list[tuple[list[str], int]] = []
    if not any(limits[model] <= 1 for model in running):
        cpu = [model for model, limit in limits.items() if limit <= 1]
        if cpu:
            groups.append((cpu, 1))
    for model, limit in limits.items():
        if limit > 1 and counts.get(model, 0) < limit:
            groups.append(([model], min(CLAIM_BATCH, limit - counts.get(model, 0))))
    return groups


def _min_batch(limits: dict[str, int], models: list[str]) -> int:
    return max(1, min(CLAIM_BATCH, max(limits[model] for model in models) // CLAIM_BATCH_DIVISOR))


def _reap(running: dict[asyncio.Future[None], str], finished: asyncio.Future[None]) -> None:
    del running[finished]
    if not finished.cancelled() and finished.exception() is not None:
        log.error("a task's processing failed", exc_info=finished.exception())
