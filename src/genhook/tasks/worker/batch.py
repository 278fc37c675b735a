"""Dynamic batching: many tasks of one model in one engine call, each still ending alone.

A model whose ``ModelSpec.max_batch_size`` is above 1 has its waiting tasks claimed
together, up to that size, in one transaction (``Lifecycle.claim``; ``claim_more`` fills it).
With fewer in hand, the worker waits up to the model's ``max_wait_ms`` for more to arrive
(each submit wakes it), then runs what it has: tasks with the same ``batch_key`` share one
``run_batch`` call, in the thread engines run in.

Each task keeps its own life: its lease (the process's ``LeaseKeeper``), deadline, progress
recorder, outputs, usage line, webhook and error. A canceled task (or one whose lease was
lost) leaves a batch being formed, and in a running batch its job's ``stop`` is set and its
result discarded, while its neighbours run on; a task past its deadline times out alone.
An entry that is a ``TaskFailure`` fails its task alone; a call that raises is followed by
one ``run`` per job, so one poison input cannot fail its neighbours.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from genhook import metrics, tracing
from genhook.db import Task, now_ms
from genhook.db.wakeups import Waiter, Wake
from genhook.engines.base import (
    STOPPED_EARLY,
    BatchEngine,
    Engine,
    EngineJob,
    EngineResult,
    ModelSpec,
)
from genhook.errors import ErrorCode, TaskFailure
from genhook.faults import is_infrastructure_error, retry_infrastructure
from genhook.logs import bind_task, unbind
from genhook.storage.inputs import discard_inputs
from genhook.tasks.lifecycle import Completion
from genhook.tasks.progress import ProgressRecorder
from genhook.tasks.worker.outcomes import end_failed, say_given_up

if TYPE_CHECKING:
    from genhook.tasks.worker.loop import Worker

log = logging.getLogger(__name__)

# A worker that forms a batch without its own wake-ups (several calls at once in one
# process) looks for arrivals this often, within the model's wait: a read, then a claim.
FILL_POLL_SECONDS = 0.005


@dataclass(eq=False)
class _Member:
    """One task of a batch and what the worker keeps for it."""

    task: Task
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    job: EngineJob | None = None
    progress: ProgressRecorder | None = None
    # Given up (canceled, lease lost, timed out, released, failed before its call): the
    # worker records nothing more for it.
    gone: bool = False
    # Its ``genhook.task.run`` span, from its claim to its end (None when untraced).
    run: Any = None

    def __post_init__(self) -> None:
        self.run = tracing.begin_task(self.task)

    @contextlib.contextmanager
    def about(self) -> Iterator[None]:
        """Work of this task alone: its id on each log line, its span the current one."""
        context = bind_task(self.task.id, self.task.account_id)
        try:
            with tracing.within(self.run):
                yield
        finally:
            unbind(context)


async def run_batch(
    worker: Worker,
    tasks: Sequence[Task],
    stop: asyncio.Event | None,
    waiter: Waiter | None,
    *,
    more_waiting: bool = False,
) -> bool:
    """Fill ``tasks`` (claimed, of one batched model, oldest first) up to the model's batch
    size, then run them, one call per batch key.

    ``waiter`` is the worker's wake-up, when this loop alone waits on it; without one, the
    batch looks for arrivals by polling within its wait. ``more_waiting``: the claim may have
    left tasks of the model behind, so the batch claims once before it waits. Returns
    whether it read a wake-up (which may have been meant for another model's task).
    """
    spec = worker.registry.get(tasks[0].model)
    assert spec is not None
    members = [_Member(task) for task in tasks]
    for member in members:
        worker.keeper.hold(member.task.id, member.lost)
    started = time.monotonic()
    grace = _Grace(worker.settings.shutdown_grace_seconds)
    try:
        woken = await _fill(worker, spec, members, stop, waiter, more_waiting)
        engine = await _prepared_in_time(worker, spec, members, stop, grace)
        if engine is None:
            return woken
        called = False
        for group in _groups(engine, [m for m in members if not m.gone]):
            if worker.tainted or (called and stop is not None and stop.is_set()):
                # An abandoned call still runs, or the worker is leaving after this batch's
                # first call (the one a lone task would make): the rest go back to the queue.
                await _release(worker, group)
                continue
            waited = time.monotonic() - started
            await _run_group(worker, spec, engine, group, stop, waited, grace)
            called = True
        return woken
    finally:
        for member in members:
            worker.prefetched.pop(member.task.id, None)
            worker.keeper.drop(member.task.id)
            tracing.end_task(member.run)


async def _fill(
    worker: Worker,
    spec: ModelSpec,
    members: list[_Member],
    stop: asyncio.Event | None,
    waiter: Waiter | None,
    claim_first: bool,
) -> bool:
    """Claim more of the model's tasks until the batch is full or ``max_wait_ms`` has passed
    since its first claim; then drop the tasks canceled meanwhile. Returns whether a
    wake-up was read."""
    loop = asyncio.get_running_loop()
    until = loop.time() + spec.max_wait_ms / 1000
    waited = woken = False

    def room() -> int:  # a task canceled meanwhile frees its place
        return spec.max_batch_size - sum(not member.lost.is_set() for member in members)

    while room() > 0 and (stop is None or not stop.is_set()):
        if not claim_first:
            remaining = until - loop.time()
            if remaining <= 0:
                break
            if waiter is not None:
                if await waiter.wait(remaining, idle=not worker.hold_ms()) is Wake.TIMEOUT:
                    break
                woken = True
            else:
                await asyncio.sleep(min(remaining, FILL_POLL_SECONDS))
                with contextlib.suppress(Exception):
                    if not await worker.lifecycle.any_runnable([spec.id], worker.reserve_ms()):
                        continue
            waited = True
            if stop is not None and stop.is_set():
                break
        claim_first = False
        try:
            more = await worker.lifecycle.claim_more(
                worker.worker_id,
                spec.id,
                room(),
                worker.reserve_ms(),
                inputs=worker.prefetched,
            )
        except Exception as error:
            log.warning("model %s: claiming more for a batch failed (%s)", spec.id, error)
            break
        for task in more:
            member = _Member(task)
            worker.keeper.hold(task.id, member.lost)
            members.append(member)
    if waited:
        # A task canceled while the batch formed leaves it before the call: one read, as
        # the keeper's next check would find it only later.
        with contextlib.suppress(Exception):
            held = await worker.lifecycle.held_of([m.task.id for m in members], worker.worker_id)
            for member in members:
                if member.task.id not in held:
                    member.lost.set()
    await _drop_lost(worker, members)
    return woken


async def _drop_lost(worker: Worker, members: list[_Member]) -> None:
    for member in members:
        if member.lost.is_set() and not member.gone:
            member.gone = True
            await say_given_up(worker, member.task, "it leaves its batch before the call")


@dataclass
class _Grace:
    """When a batch told to stop gives back what it still holds: its grace, counted once from
    the stop it first saw, across its model's load and its first call."""

    seconds: float
    until: float | None = None  # the loop's time

    def start(self) -> float:
        if self.until is None:
            self.until = asyncio.get_running_loop().time() + self.seconds
        return self.until


async def _prepared_in_time(
    worker: Worker,
    spec: ModelSpec,
    members: list[_Member],
    stop: asyncio.Event | None,
    grace: _Grace,
) -> Engine | None:
    """``_prepare``, unless the worker leaves meanwhile: past its grace the tasks go back to
    the queue (a model load goes on in its thread; the worker leaves without it)."""
    preparing = asyncio.ensure_future(_prepare(worker, spec, members))
    if stop is None:
        return await preparing
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({preparing, stopping}, return_when="FIRST_COMPLETED")
        if not preparing.done():
            left = grace.start() - asyncio.get_running_loop().time()
            await asyncio.wait({preparing}, timeout=max(0.0, left))
    finally:
        stopping.cancel()
    if preparing.done():
        return preparing.result()
    preparing.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await preparing
    await _release(worker, members)
    return None


async def _prepare(worker: Worker, spec: ModelSpec, members: list[_Member]) -> Engine | None:
    """Load the engine and every task's inputs; a task whose inputs fail ends alone."""
    try:
        engine = await worker.load_engine(spec.id)
    except Exception as error:  # each task ends as the error says (a model too large: 3020)
        for member in members:
            if not member.gone:
                member.gone = True
                with member.about():
                    await end_failed(worker, member.task, error, in_engine=True)
        return None
    live = [member for member in members if not member.gone]
    loaded = await asyncio.gather(
        *(_inputs_of(worker, member) for member in live), return_exceptions=True
    )
    for member, images in zip(live, loaded, strict=True):
        if isinstance(images, BaseException):
            member.gone = True
            with member.about():
                await end_failed(worker, member.task, images, in_engine=False)
            continue
        member.progress = ProgressRecorder(
            worker.db, member.task.id, worker.worker_id, worker.settings.progress_interval_seconds
        )
        member.job = EngineJob(
            task_id=member.task.id,
            model=member.task.model,
            params=member.task.params,
            images=images,
            report=member.progress.report,
            deadline=member.task.deadline_at / 1000,
            stop=member.stop,
            request=worker.request_of(member.task),
        )
    return engine


async def _inputs_of(worker: Worker, member: _Member) -> list[bytes]:
    task = member.task
    with member.about():
        return await retry_infrastructure(
            lambda: worker.load_inputs(task),
            what=f"task {task.id}: loading its inputs",
            budget_seconds=worker.settings.fault_retry_seconds,
        )


def _groups(engine: Engine, members: list[_Member]) -> list[list[_Member]]:
    """The members by batch key, in the order of each key's oldest task."""
    groups: dict[Hashable, list[_Member]] = {}
    for member in members:
        assert member.job is not None
        key: Hashable = None
        if isinstance(engine, BatchEngine):
            try:
                key = engine.batch_key(member.job)
            except Exception:
                with member.about():
                    log.exception("task %s: its batch key failed; it runs alone", member.task.id)
                key = ("alone", member.task.id)
        groups.setdefault(key, []).append(member)
    return list(groups.values())


def call_batch(engine: Engine, jobs: Sequence[EngineJob]) -> list[EngineResult | Exception]:
    """One engine call for ``jobs`` (``run`` for a lone job or an engine without
    ``run_batch``); when the call raises, each job runs alone, so the error stays with the
    input that caused it. One entry per job, in order: a result or the error ending it."""
    if len(jobs) > 1 and isinstance(engine, BatchEngine):
        try:
            results = list(engine.run_batch(jobs))
            if len(results) != len(jobs):
                raise RuntimeError(f"run_batch returned {len(results)} entries for {len(jobs)}")
            return [_checked(entry) for entry in results]
        except Exception:
            if not all(job.given_up() for job in jobs):  # a call stopped for them is no fault
                log.exception("a batch of %d failed; running each of its tasks alone", len(jobs))
    return [_alone(engine, job) for job in jobs]


def _checked(entry: object) -> EngineResult | Exception:
    if isinstance(entry, EngineResult | Exception):
        return entry
    return RuntimeError(f"run_batch returned {type(entry).__name__}, not a result")


def _alone(engine: Engine, job: EngineJob) -> EngineResult | Exception:
    if job.stop.is_set():
        return TaskFailure(ErrorCode.ENGINE_ERROR, STOPPED_EARLY)
    if job.given_up():
        return TaskFailure(ErrorCode.TIMEOUT, "the task did not finish by its deadline")
    try:
        return engine.run(job)
    except Exception as error:
        return error


async def _run_group(
    worker: Worker,
    spec: ModelSpec,
    engine: Engine,
    group: list[_Member],
    stop: asyncio.Event | None,
    waited: float,
    grace: _Grace,
) -> None:
    await _drop_lost(worker, group)  # canceled while an earlier key's call ran
    group = [member for member in group if not member.gone]
    if not group:
        return
    metrics.batch_called(spec.id, len(group), waited)
    jobs = [member.job for member in group if member.job is not None]
    ids = [job.task_id for job in jobs]
    worker.engine_started(ids)

    def call() -> list[EngineResult | Exception]:
        try:
            return call_batch(engine, jobs)
        finally:
            worker.engine_ended(ids)

    started = time.monotonic()
    shared: dict[str, str | int] = {"genhook.model": spec.id, "genhook.batch.size": len(jobs)}
    with tracing.batch_call([member.run for member in group], shared):
        # The thread's copy of the context has the call's span current: its progress events.
        work = asyncio.ensure_future(asyncio.to_thread(call))
    async with contextlib.AsyncExitStack() as stack:
        for member in group:
            assert member.progress is not None
            await stack.enter_async_context(member.progress.running())
        await _supervise(worker, group, work, stop, grace)
    if not work.done():
        # Every task of the call was given up: an engine that can, stops soon.
        await worker.await_engine(ids, engine, stop)
        return
    results = work.result()
    worker.ran_for(spec.id, time.monotonic() - started)
    await _record(worker, group, results, len(jobs))


async def _supervise(
    worker: Worker,
    group: list[_Member],
    work: asyncio.Future[Any],
    stop: asyncio.Event | None,
    grace: _Grace,
) -> None:
    """Wait for the call while each task's cancel, lease and deadline apply to it alone;
    return early only when every task of the call was given up."""
    loop = asyncio.get_running_loop()
    while not work.done():
        live = [member for member in group if not member.gone]
        if not live:
            return
        # Deadlines are epoch milliseconds; the loop's clock measures the wait.
        earliest = min(member.task.deadline_at for member in live)
        limit = loop.time() + max(0.0, (earliest - now_ms()) / 1000)
        if grace.until is not None:
            limit = min(limit, grace.until)
        waiters: set[asyncio.Future[Any]] = {work}
        waiters.update(asyncio.ensure_future(member.lost.wait()) for member in live)
        stopping = None
        if stop is not None and grace.until is None:
            stopping = asyncio.ensure_future(stop.wait())
            waiters.add(stopping)
        try:
            await asyncio.wait(
                waiters, timeout=max(0.0, limit - loop.time()), return_when="FIRST_COMPLETED"
            )
        finally:
            for waiter in waiters:
                if waiter is not work:
                    waiter.cancel()
        if work.done():
            return
        now = now_ms()
        for member in live:
            if member.lost.is_set():
                # Also how a cancel arrives: the task is no longer ``processing``.
                _give_up(member)
                await say_given_up(worker, member.task, "it leaves its batch's call")
            elif now >= member.task.deadline_at:
                _give_up(member)
                with member.about():
                    if await worker.end_task(member.task, worker.lifecycle.time_out):
                        log.info("task %s timed out in a batch", member.task.id)
        if stop is not None and stop.is_set() and grace.until is None:
            grace.start()
            log.info("a batch of %d: finishing before shutdown", len(live))
        elif grace.until is not None and loop.time() >= grace.until:
            await _release(worker, group)
            return


def _give_up(member: _Member) -> None:
    member.gone = True
    member.stop.set()


async def _release(worker: Worker, members: list[_Member]) -> None:
    """Give the members not yet given up back to the queue, unharmed (the worker leaves)."""
    for member in members:
        if not member.gone:
            _give_up(member)
            await worker.release_task(member.task)


async def _record(
    worker: Worker, group: list[_Member], results: list[EngineResult | Exception], size: int
) -> None:
    """End each task of a finished call on its own: outputs stored, then the completions in
    one transaction; failures alone."""
    members = [member for member in group if member.job is not None]
    done: list[tuple[_Member, Completion]] = []
    for member, result in zip(members, results, strict=True):
        if member.gone:
            continue  # canceled, timed out or released: its result is discarded
        with member.about():
            if isinstance(result, Exception):
                await end_failed(worker, member.task, result, in_engine=True)
                continue
            try:
                keys = await worker.store_outputs(member.task, result)
            except Exception as error:
                await end_failed(worker, member.task, error, in_engine=False)
                continue
        cost = None if result.cost_usd is None else int(result.cost_usd * 1_000_000)
        flags = [output.nsfw for output in result.outputs]
        info = {**result.info, "batch_size": size}
        item = Completion(member.task.id, keys, flags, info, cost, result.stt_result)
        done.append((member, item))
    if not done:
        return
    items = [item for _, item in done]
    try:
        outcomes = await retry_infrastructure(
            lambda: worker.lifecycle.complete_many(worker.worker_id, items),
            what=f"a batch of {len(items)}: recording its outcomes",
            budget_seconds=worker.settings.fault_retry_seconds,
        )
    except Exception as error:
        if not is_infrastructure_error(error):
            raise
        log.error("a batch of %d: could not record its outcomes (%s)", len(items), error)
        outcomes = [False] * len(items)
    for (member, item), ended in zip(done, outcomes, strict=True):
        if ended:
            await discard_inputs(worker.storage, member.task.inputs)
        else:
            with member.about():
                await worker.discard_outputs(member.task.id, item.outputs)
