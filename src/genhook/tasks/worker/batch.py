"""The batch runner: every claim a worker makes runs here, 1 to ``max_batch_size`` tasks
of one model, a lone task being a batch of one, for every kind of engine (synchronous in a
thread, ``AsyncEngine`` on the loop, ``BatchEngine`` many jobs per call, a local model in
its model process).

One path for all of them: fill (a batched model waits up to its ``max_wait_ms`` for more
tasks, ``Lifecycle.claim_more``), prepare (the engine loaded, each task's inputs read), call
(one call per batch key), record (outputs stored, the completions in one transaction, or in
the slot's next claim) and the failure rules (``outcomes.py``), each task supervised alone
throughout: its lease (the process's ``LeaseKeeper``), cancel, deadline and the worker's
stop. A canceled task (or one whose lease was lost) leaves a batch being formed, and in a
running call its job's ``stop`` is set and its result discarded, while its neighbours run
on; a task past its deadline times out alone. An entry that is a ``TaskFailure`` fails its
task alone; a batched call that raises is followed by one ``run`` per job, so one poison
input cannot fail its neighbours. Each task has its ``genhook.task.run`` span and its id on
every log line about it; a call shared by several tasks has one span linked from theirs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from genhook import metrics, tracing
from genhook.db import Task, now_ms
from genhook.engines.base import (
    STOPPED_EARLY,
    AsyncEngine,
    BatchEngine,
    Engine,
    EngineJob,
    EngineResult,
    ModelSpec,
)
from genhook.errors import ErrorCode, TaskFailure
from genhook.faults import retry_infrastructure
from genhook.logs import bind_task, unbind
from genhook.storage.inputs import discard_inputs
from genhook.tasks.lifecycle import Completion
from genhook.tasks.progress import ProgressRecorder
from genhook.tasks.worker.outcomes import end_failed, say_given_up

if TYPE_CHECKING:
    from genhook.tasks.worker.loop import Slot, Worker

log = logging.getLogger(__name__)

Results = list[EngineResult | Exception]


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
    worker: Worker, tasks: Sequence[Task], stop: asyncio.Event | None, slot: Slot | None
) -> None:
    """Run ``tasks`` (claimed, of one model, oldest first): filled up to the model's batch
    size when it batches, then one call per batch key, each task recorded alone.

    ``slot``: the loop's slot that claimed them; when it may, the completions are recorded
    by its next claim (``Lifecycle.claim``'s ``complete``), whose tasks it runs next.
    """
    spec = worker.registry.get(tasks[0].model)
    assert spec is not None
    members = [_Member(task) for task in tasks]
    for member in members:
        worker.keeper.hold(member.task.id, member.lost)
    started = time.monotonic()
    grace = _Grace(worker.settings.shutdown_grace_seconds)
    try:
        if spec.max_batch_size > 1:
            await _fill(worker, spec, members, stop)
        engine = await _prepared(worker, spec, members, stop, grace)
        if engine is None:
            return
        called = False
        for group in _groups(engine, [m for m in members if not m.gone]):
            if worker.tainted or (called and stop is not None and stop.is_set()):
                # An abandoned call still runs, or the worker is leaving after this batch's
                # first call (the one a lone task would make): the rest go back to the queue.
                await _release(worker, group)
                continue
            waited = time.monotonic() - started
            await _run_group(worker, spec, engine, group, stop, waited, grace, slot)
            called = True
    finally:
        for member in members:
            worker.prefetched.pop(member.task.id, None)
            worker.keeper.drop(member.task.id)
            tracing.end_task(member.run)


async def _fill(
    worker: Worker, spec: ModelSpec, members: list[_Member], stop: asyncio.Event | None
) -> None:
    """Claim more of the model's tasks until the batch is full or ``max_wait_ms`` has passed
    since its first claim, each time a wake-up says work arrived; then drop the tasks
    canceled meanwhile."""
    loop = asyncio.get_running_loop()
    until = loop.time() + spec.max_wait_ms / 1000
    waited = False

    def room() -> int:  # a task canceled meanwhile frees its place
        return spec.max_batch_size - sum(not member.lost.is_set() for member in members)

    with worker.filling():
        while room() > 0 and (stop is None or not stop.is_set()):
            heard = worker.heard
            remaining = until - loop.time()
            if remaining <= 0 or not await worker.arrival(heard, remaining):
                break
            waited = True
            if stop is not None and stop.is_set():
                break
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


async def _prepared(
    worker: Worker,
    spec: ModelSpec,
    members: list[_Member],
    stop: asyncio.Event | None,
    grace: _Grace,
) -> Engine | None:
    """``_prepare``, supervised as a call is: a task canceled, lost or past its deadline
    meanwhile ends alone, and past the worker's grace the tasks go back to the queue (a
    model load goes on in its thread; the worker leaves without it)."""
    if worker.loaded(spec.id) and all(_inputs_in_hand(worker, m.task) for m in members):
        # Nothing to wait for: the engine is loaded, the inputs came with the claim.
        return await _prepare(worker, spec, members)
    preparing = asyncio.ensure_future(_prepare(worker, spec, members))
    await _supervise(worker, spec, members, preparing, stop, grace)
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
    if len(live) == 1:  # no task to gather
        loaded: list[list[bytes] | BaseException] = [await _caught(_inputs_of(worker, live[0]))]
    else:
        loaded = await asyncio.gather(*(_caught(_inputs_of(worker, m)) for m in live))
    for member, images in zip(live, loaded, strict=True):
        if member.gone:
            continue  # given up while its inputs were read
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
            report=tracing.steps(member.progress.report),
            deadline=member.task.deadline_at / 1000,
            stop=member.stop,
            request=worker.request_of(member.task),
        )
    return engine


def _inputs_in_hand(worker: Worker, task: Task) -> bool:
    """Whether every input of ``task`` was read by its claim (no fetch, no store to wait on)."""
    prefetched = worker.prefetched.get(task.id, {})
    return all(item.get("blob") in prefetched for item in task.inputs)


async def _caught(inputs: Awaitable[list[bytes]]) -> list[bytes] | BaseException:
    try:
        return await inputs
    except Exception as error:
        return error


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
    if len(members) == 1:  # a lone task: no key to ask for
        return [members]
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


def call_batch(engine: Engine, jobs: Sequence[EngineJob]) -> Results:
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


async def _call_async(engine: AsyncEngine, jobs: Sequence[EngineJob]) -> Results:
    """An ``AsyncEngine``'s jobs on the loop; one entry per job, as ``call_batch``."""

    async def one(job: EngineJob) -> EngineResult | Exception:
        try:
            return await engine.run_async(job)
        except Exception as error:
            return error

    return list(await asyncio.gather(*(one(job) for job in jobs)))


def _call(
    worker: Worker, spec: ModelSpec, engine: Engine, group: list[_Member]
) -> asyncio.Future[Results]:
    """The engine's call for ``group``, started: on the loop for an ``AsyncEngine``, else in
    a thread. Its span is the task's own ``genhook.engine.run`` for a lone task (whose log
    tag the call's log lines carry), one linked with each task's for several."""
    jobs = [member.job for member in group if member.job is not None]
    ids = [job.task_id for job in jobs]
    run: Awaitable[Results]
    if isinstance(engine, AsyncEngine):
        run = _call_async(engine, jobs)
    else:
        worker.engine_started(ids)

        def call() -> Results:
            try:
                return call_batch(engine, jobs)
            finally:
                worker.engine_ended(ids)

        run = asyncio.to_thread(call)

    async def traced() -> Results:
        if len(group) == 1:
            spanned = tracing.span("genhook.engine.run", {"genhook.model": spec.id})
        else:
            shared: dict[str, str | int] = {
                "genhook.model": spec.id,
                "genhook.batch.size": len(jobs),
            }
            spanned = tracing.batch_call([member.run for member in group], shared)
        with spanned:  # the thread's copy of the context has the call's span current
            return await run

    if len(group) == 1:
        with group[0].about():  # the task's tag and span, copied into the call's context
            return asyncio.ensure_future(traced())
    return asyncio.ensure_future(traced())


async def _run_group(
    worker: Worker,
    spec: ModelSpec,
    engine: Engine,
    group: list[_Member],
    stop: asyncio.Event | None,
    waited: float,
    grace: _Grace,
    slot: Slot | None,
) -> None:
    for member in group:  # canceled while an earlier key's call ran
        if member.lost.is_set() and not member.gone:
            member.gone = True
            await say_given_up(worker, member.task, _leaving(spec))
    group = [member for member in group if not member.gone]
    if not group:
        return
    if spec.max_batch_size > 1:
        metrics.batch_called(spec.id, len(group), waited)
    ids = [member.task.id for member in group]
    started = time.monotonic()
    work = _call(worker, spec, engine, group)
    async with contextlib.AsyncExitStack() as stack:
        for member in group:
            assert member.progress is not None
            await stack.enter_async_context(member.progress.running())
        await _supervise(worker, spec, group, work, stop, grace)
    if not work.done():
        # Every task of the call was given up: an engine that can, stops soon.
        if isinstance(engine, AsyncEngine):
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
        else:
            await worker.await_engine(ids, engine, stop)
        return
    results = work.result()
    worker.ran_for(spec.id, time.monotonic() - started)
    await _record(worker, spec, group, results, stop, slot)


def _leaving(spec: ModelSpec) -> str:
    return "it leaves its batch's call" if spec.max_batch_size > 1 else "its run is abandoned"


async def _supervise(
    worker: Worker,
    spec: ModelSpec,
    group: list[_Member],
    work: asyncio.Future[Any],
    stop: asyncio.Event | None,
    grace: _Grace,
) -> None:
    """Wait for ``work`` (the preparation or the call) while each task's cancel, lease and
    deadline apply to it alone; return early only when every task was given up."""
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
                await say_given_up(worker, member.task, _leaving(spec))
            elif now >= member.task.deadline_at:
                _give_up(member)
                with member.about():
                    if await worker.end_task(member.task, worker.lifecycle.time_out):
                        log.info("task %s timed out", member.task.id)
        if stop is not None and stop.is_set() and grace.until is None:
            grace.start()
            for member in live:
                if not member.gone:
                    with member.about():
                        log.info("task %s: finishing before shutdown", member.task.id)
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
            with member.about():
                await worker.release_task(member.task)


async def _record(
    worker: Worker,
    spec: ModelSpec,
    group: list[_Member],
    results: Results,
    stop: asyncio.Event | None,
    slot: Slot | None,
) -> None:
    """End each task of a finished call on its own: a failure as the rules say, a success
    with its outputs stored, then the completions together in one transaction."""
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
        info = result.info
        if spec.max_batch_size > 1:
            info = {**info, "batch_size": len(members)}
        item = Completion(member.task.id, keys, flags, info, cost, result.stt_result)
        done.append((member, item))
    if not done:
        return
    items = [item for _, item in done]
    outcomes = await worker.complete(spec.id, items, stop, slot)
    for (member, item), ended in zip(done, outcomes, strict=True):
        if ended:
            await discard_inputs(worker.storage, member.task.inputs)
        else:
            with member.about():
                await worker.discard_outputs(member.task.id, item.outputs)
