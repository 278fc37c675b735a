"""The worker loop: claim a task, keep its lease alive, run its engine, record the outcome.

The package's parts: this loop (``Worker``), the slots of models that run several calls at
once (``slots.py``), the batch runner (``batch.py``), the outcome rules (``outcomes.py``),
model residency and affinity (``affinity.py``) and the leases (``leases.py``).

One worker runs one CPU task at a time; ``genhook serve`` starts several worker processes, so
CPU-heavy engines never block the API's event loop. The engine runs in a thread of the
worker process, so heartbeats keep flowing while it computes. Models with
``ModelSpec.concurrency`` above 1 run several calls at once: an ``AsyncEngine``'s on the
loop, a thread-safe synchronous engine's in threads. A batched model (``max_batch_size``
above 1) runs many tasks in one call (``tasks/worker/batch.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from genhook import tracing
from genhook.db import Task, now_ms
from genhook.db.wakeups import TASKS, Waiter, Wake
from genhook.engines.base import (
    AsyncEngine,
    Engine,
    EngineJob,
    EngineResult,
    StepEngine,
    stored_request,
)
from genhook.engines.registry import claimable_models
from genhook.errors import ErrorCode, TaskFailure
from genhook.faults import is_infrastructure_error, retry_infrastructure
from genhook.logs import bind_task, unbind
from genhook.net import client_ssl_context
from genhook.retry import backoff_delay
from genhook.runtime.services import Services
from genhook.storage import DatabaseBlobStore
from genhook.storage.blobs import extension_of, new_blob_key
from genhook.storage.inputs import discard_inputs, keeps_inputs
from genhook.tasks.group_commit import GroupCommit
from genhook.tasks.lifecycle import NO_PREFERENCE, Completion, Lifecycle, Preference
from genhook.tasks.progress import ProgressRecorder
from genhook.tasks.store import reads
from genhook.tasks.worker import affinity
from genhook.tasks.worker.batch import run_batch
from genhook.tasks.worker.leases import LeaseKeeper
from genhook.tasks.worker.outcomes import OutputsNotStored, end_failed, say_given_up
from genhook.tasks.worker.slots import run_concurrent

log = logging.getLogger(__name__)


# How long an engine asked to stop gets before its process is marked for replacement (a
# ``StepEngine`` may ask for longer).
ENGINE_STOP_SECONDS = 0.5
ENGINE_STOP_POLL_SECONDS = 0.05
# How long a ``StepEngine``'s call gets to end once aborted.
ENGINE_ABORT_SECONDS = 15.0


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class LoadNotWanted(Exception):
    """A model's load reached its turn after every task that needed it was given up."""


class PreloadFailed(RuntimeError):
    """A model of ``GENHOOK_PRELOAD_MODELS`` could not be loaded: the worker does not start."""


@dataclass
class Worker(Services):
    worker_id: str = field(default_factory=default_worker_id)

    def __post_init__(self) -> None:
        self.lifecycle = Lifecycle(self.settings, self.db, self.storage)
        self._engines: dict[str, Engine] = {}
        self._models = claimable_models(self.registry, self.settings)
        # The tasks whose engine call runs in a thread now (several for a batch, or for a
        # model that allows several calls at once).
        self._engine_tasks: set[str] = set()
        # Input images live in the database with their task (see submission.input_rows),
        # or in the bucket of a blob store that keeps them.
        self._inputs = self.storage if keeps_inputs(self.storage) else DatabaseBlobStore(self.db)
        self._ssl_context = client_ssl_context(self.settings.webhook_ca_file)
        # Set when an abandoned engine call is still computing: the process should be replaced.
        self.tainted = False
        # Tasks of each model one process runs at once (see tasks/worker/slots.py).
        self.limits = {spec.id: spec.concurrency for spec in self.registry}
        # Batched models and the most tasks one call of each takes (tasks/worker/batch.py).
        self.batch_sizes = {
            spec.id: spec.max_batch_size for spec in self.registry if spec.max_batch_size > 1
        }
        self._load_lock = asyncio.Lock()
        # Each model's load in progress, shared by every task that needs it: a task given up
        # meanwhile leaves the load running (a thread), and the next one waits for it. A load
        # still waiting for its turn when no task wants it any more does not start.
        self._loading: dict[str, asyncio.Future[Engine]] = {}
        self._wanted: Counter[str] = Counter()
        # Completions of I/O-bound tasks, many in flight, share their transactions.
        self._completer: GroupCommit[Completion, bool] = GroupCommit(
            lambda items: self.lifecycle.complete_many(self.worker_id, items), 64
        )
        self.keeper = LeaseKeeper(
            self.lifecycle,
            self.worker_id,
            self.settings.lease_seconds / 3,
            self.settings.cancel_check_seconds,
        )
        # Input images read by the claim's transaction, by task id.
        self.prefetched: dict[str, dict[str, bytes]] = {}
        # Recent run times per model: a task with less time left than these is not started.
        self._run_seconds: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=8))
        self.wakeup = Waiter()
        # Whether the last claim saw another task waiting (see _run).
        self._more = False
        # The one-at-a-time loop's stop event while it runs: only that loop completes a task
        # and claims its successor in one transaction (see _complete).
        self._chain_stop: asyncio.Event | None = None
        # Tasks claimed with the last completion, run next without a claim of its own.
        self._next: list[Task] = []
        # Models whose tasks go preferably to a worker that has their weights loaded: this
        # one takes such a task only after it waited its hold, unless it has them.
        self._affine = [spec.id for spec in self.registry if spec.affinity]
        # What this process holds loaded, as the engines say (tests replace it): models, and
        # per model its adapters.
        self.resident: Callable[[], frozenset[str]] = self.registry.resident
        self.affinity = affinity.Affinity(
            lambda: self.settings.local_models_affinity_seconds,
            self._affine,
            lambda: self.resident(),
            self._run_seconds,
            self.registry.resident_adapters,
        )
        # Set while storage refuses this worker's outputs: claims pause until a probe write
        # succeeds (a task claimed now could not be stored either).
        self._storage_down = False
        self._storage_probe_at = 0.0
        self._storage_failures = 0
        # False until the models of GENHOOK_PRELOAD_MODELS are loaded (the worker's /readyz).
        self.preloaded = not self.settings.preload_models

    def engine(self, model: str) -> Engine:
        engine = self._engines.get(model)
        if engine is None:
            spec = self.registry.get(model)
            assert spec is not None
            engine = spec.engine_factory(self.settings)
            engine.load()
            self._engines[model] = engine
        return engine

    async def load_engine(self, model: str) -> Engine:
        """The model's engine, loaded (in a thread, one model at a time) on first use."""
        engine = self._engines.get(model)
        if engine is not None:
            return engine
        loading = self._loading.get(model)
        if loading is None or loading.done():
            loading = asyncio.ensure_future(self._load(model))
            self._loading[model] = loading
            loading.add_done_callback(functools.partial(self._loaded, model))
        self._wanted[model] += 1
        try:
            return await asyncio.shield(loading)
        finally:
            self._wanted[model] -= 1

    async def _load(self, model: str) -> Engine:
        async with self._load_lock:
            if not self._wanted[model]:
                raise LoadNotWanted(f"{model}: every task that needed it was given up")
            return await asyncio.to_thread(self.engine, model)

    def _loaded(self, model: str, done: asyncio.Future[Engine]) -> None:
        if self._loading.get(model) is done:
            del self._loading[model]
        if not done.cancelled():
            done.exception()  # read, even when every task that waited has been given up

    @property
    def loading(self) -> bool:
        """A model load is still running (in a thread, which nothing can stop)."""
        return bool(self._loading)

    def request_of(self, task: Task) -> BaseModel | None:
        """The model's validated request, parsed once here from the stored params."""
        spec = self.registry.get(task.model)
        return None if spec is None else stored_request(spec.request_schema, task.params)

    async def preload(self) -> None:
        """Load the engines of ``GENHOOK_PRELOAD_MODELS`` before anything is claimed (the
        registry refused unknown ones when it was built)."""
        for model in self.settings.preload_models:
            started = time.monotonic()
            log.info("worker %s: preloading %s", self.worker_id, model)
            try:
                await self.load_engine(model)
            except TaskFailure as failure:  # the engine's own words: no traceback
                raise PreloadFailed(f"cannot preload {model}: {failure.message}") from None
            except Exception as error:  # unforeseen (weights changed since the start): logged
                log.exception("worker %s: preloading %s failed", self.worker_id, model)
                raise PreloadFailed(f"cannot preload {model}: {error}") from None
            log.info(
                "worker %s: %s loaded in %.1f s", self.worker_id, model, time.monotonic() - started
            )
        resident, preloaded = self.resident(), self.settings.preload_models
        unloaded = [m for m in preloaded if m in self._affine and m not in resident]
        if unloaded:  # a later one's load made room by unloading it
            raise PreloadFailed(
                f"cannot preload {', '.join(unloaded)} beside the models preloaded after it: "
                "together they need more than the device's memory budget "
                "(GENHOOK_LOCAL_MODELS_MEMORY_GB); preload fewer, or put them on other devices"
            )
        self.preloaded = True

    def hold_ms(self) -> dict[str, int] | None:
        """Per model with affinity whose weights this process lacks, the time its task must
        have waited before this worker takes it (``affinity.py``); None when there is none,
        or affinity is off (a wait of 0)."""
        return self.affinity.hold_ms()

    def preference(self) -> Preference:
        """The models this worker takes first, when a task's wait ends that, and the adapters
        whose tasks it takes first among their model's (affinity)."""
        preferred = self.affinity.preferred()
        if not preferred:
            return NO_PREFERENCE
        return preferred, self.affinity.overdue_ms(), self.affinity.held_adapters(preferred)

    def idle_poll(self) -> float:
        """How long an idle worker waits before it looks again: the poll, or the hold while
        a task held for another worker may become this one's."""
        return self.affinity.idle_poll(self.settings.worker_poll_seconds)

    async def storage_ready(self) -> bool:
        """False while storage refuses outputs: after a task's outputs could not be stored,
        claims pause until a probe write succeeds (tried at most once a poll, backing off)."""
        if not self._storage_down:
            return True
        if time.monotonic() < self._storage_probe_at:
            return False
        key = new_blob_key("outputs", extension_of("image/png"))
        try:
            await self.storage.put(key, b"", "image/png")
            with contextlib.suppress(Exception):
                await self.storage.delete(key)
        except Exception as error:
            if not is_infrastructure_error(error):  # not an outage: never pause for it
                log.exception("worker %s: storage probe failed", self.worker_id)
                self._storage_down = False
                return True
            self._storage_failures += 1
            delay = backoff_delay(self._storage_failures, self.settings.worker_poll_seconds, 30.0)
            self._storage_probe_at = time.monotonic() + delay
            log.warning("worker %s: storage still refuses writes (%s)", self.worker_id, error)
            return False
        log.info("worker %s: storage takes writes again; claims resume", self.worker_id)
        self._storage_down = False
        self._storage_failures = 0
        return True

    def _storage_refused(self) -> None:
        if not self._storage_down:
            log.warning("worker %s: storage refuses outputs; claims pause", self.worker_id)
        self._storage_down = True
        self._storage_failures = 0
        self._storage_probe_at = 0.0  # the next claim probes first

    async def run(self, stop: asyncio.Event) -> None:
        """Claim and run tasks until ``stop`` is set; the task in hand finishes first."""
        await self.preload()
        log.info("worker %s started (models: %s)", self.worker_id, ", ".join(self._models))
        # A submit or a requeue in any process wakes the idle worker; the poll is the net.
        self.wakeup.attach(self.db.url, TASKS, self.db.sqlite_path)
        stopping = asyncio.ensure_future(stop.wait())
        stopping.add_done_callback(lambda _: self.wakeup.set())
        try:
            await self._run(stop)
        finally:
            stopping.cancel()
            self.wakeup.close()
        await self.close_engines()
        log.info("worker %s stopped", self.worker_id)

    async def _run(self, stop: asyncio.Event) -> None:
        if any(limit > 1 for limit in self.limits.values()):
            # A synchronous engine's calls run in the loop's threads: enough of them for
            # every model's calls at once (threads start only when needed).
            threads = sum(self.limits.values()) + 4
            if threads > min(32, (os.cpu_count() or 1) + 4):
                executor = ThreadPoolExecutor(threads, thread_name_prefix="engine")
                asyncio.get_running_loop().set_default_executor(executor)
            await run_concurrent(self, stop)
        self._chain_stop = stop
        try:
            await self._run_sequential(stop)
        finally:
            self._chain_stop = None
            await self._release_next()

    async def _run_sequential(self, stop: asyncio.Event) -> None:
        failures = 0
        waited = ran = False
        while not stop.is_set() and not self.tainted:
            pause = self.idle_poll()
            try:
                # After a wait (a broadcast wake-up or the poll), read before claiming: a
                # claim is a write, and a broadcast wakes every idle worker while only one
                # gets the task. A writer that took this worker alone (Wake.TARGETED) sent
                # it a task, so that claim goes ahead at once. After a task, claim again
                # only if another was waiting at the claim or a submit has woken this
                # worker since. A task claimed with the last completion runs next.
                if not self._next and ran and not self._more and not self.wakeup.pending():
                    ran = False
                elif (
                    self._next
                    or not waited
                    or await self.lifecycle.any_runnable(
                        self._models, self.reserve_ms(), self.hold_ms()
                    )
                ):
                    ran = await self.run_once(stop)
                else:
                    ran = False
                failures = 0
            except Exception as error:
                failures += 1
                if is_infrastructure_error(error):
                    log.warning("worker %s: claim failed (%s); retrying", self.worker_id, error)
                else:
                    log.exception("worker %s: claim failed; retrying", self.worker_id)
                pause = backoff_delay(failures, pause, 2.0)
                ran = False
            waited = False
            if not ran and not stop.is_set():
                # A worker that would hold a task back for another (affinity) is not woken
                # alone on SQLite: that wake-up could be for the task the other should take.
                wake = await self.wakeup.wait(pause, idle=not self.hold_ms())
                log.debug("worker %s: woken (%s)", self.worker_id, wake.value)
                # On PostgreSQL a claim that finds nothing writes nothing and locks nothing
                # (SKIP LOCKED), so a worker woken by NOTIFY claims at once too.
                waited = wake is not Wake.TARGETED and not (
                    wake is Wake.BROADCAST and self.db.is_postgres
                )

    async def close_engines(self) -> None:
        """Close what engines hold on the loop (an upstream engine's connection pool)."""
        for engine in self._engines.values():
            close = getattr(engine, "aclose", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()

    async def run_once(self, stop: asyncio.Event | None = None) -> bool:
        """Run one task (or one batch): the one claimed with the last completion, or one
        claimed now."""
        tasks, self._next = self._next, []
        chained = bool(tasks)
        if not tasks:
            if not await self.storage_ready():
                return False
            claim = await self.lifecycle.claim(
                self.worker_id,
                self._models,
                limits=self.batch_sizes,
                reserve_ms=self.reserve_ms(),
                inputs=self.prefetched,
                hold_ms=self.hold_ms(),
                affinity=self.preference(),
            )
            tasks, self._more = claim.tasks, claim.more
        if not tasks:
            log.debug("worker %s: claim found no task", self.worker_id)
            return False
        if tasks[0].model in self.batch_sizes:
            # A task claimed with a completion may have left more of its model waiting. A
            # wake-up read while the batch formed may have been for another model's task.
            woken = await run_batch(self, tasks, stop, self.wakeup, more_waiting=chained)
            self._more = self._more or woken
        else:
            await self.process(tasks[0], stop)
        return True

    async def run_claimed(self, tasks: list[Task], stop: asyncio.Event | None) -> None:
        """Run tasks claimed by the concurrent loop: a batch of a batched model (filled by
        polling, as that loop waits on the wake-ups itself), or one task."""
        if tasks[0].model in self.batch_sizes:
            await run_batch(self, tasks, stop, None)
        else:
            await self.process(tasks[0], stop)

    def reserve_ms(self) -> dict[str, int]:
        """Per model, the time a task needs left before its deadline to be worth starting."""
        margin = self.settings.task_start_margin_seconds
        return {
            model: int(1000 * max([margin, *self._run_seconds.get(model, ())]))
            for model in self._models
        }

    async def process(self, task: Task, stop: asyncio.Event | None = None) -> None:
        context = bind_task(task.id, task.account_id)  # every log line about it says so
        try:
            with tracing.task_run(task):
                await self._process(task, stop)
        finally:
            unbind(context)

    async def _process(self, task: Task, stop: asyncio.Event | None) -> None:
        # The job's stop signal (EngineJob.stop), set whenever the task is given up; one per
        # task, since I/O-bound models run several tasks of one process at once.
        job_stop = threading.Event()
        lost = asyncio.Event()
        # Set once the engine's result is in: the deadline no longer applies (the storing
        # that remains is the service's part, bounded by its fault retries).
        computed = asyncio.Event()
        # Heartbeats and cancel checks, batched with the process's other tasks (leases.py).
        self.keeper.hold(task.id, lost)
        work = asyncio.create_task(self._execute(task, job_stop, computed))
        try:
            await self._supervise(task, work, lost, stop, job_stop, computed)
        finally:
            self.prefetched.pop(task.id, None)
            self.keeper.drop(task.id)
        # Only this task's own engine run counts: an I/O-bound task that ends while another
        # task's engine runs in the thread leaves nothing behind.
        if task.id in self._engine_tasks and job_stop.is_set():
            # Asked to stop (cancel, deadline, lost lease): an engine that can, stops soon.
            await self.await_engine([task.id], self._engines.get(task.model), stop)
        elif task.id in self._engine_tasks:
            self._abandoned([task.id])

    async def await_engine(
        self, task_ids: list[str], engine: Engine | None, stop: asyncio.Event | None = None
    ) -> None:
        """Give an engine call whose tasks were all given up a moment to stop; a
        ``StepEngine`` gets as long as it says its steps take, then is aborted. One still
        running taints the worker. A worker leaving (``stop`` set, now or while it waits)
        keeps nothing for a next task, so it waits for no step or load beyond the usual
        moment."""
        asked = time.monotonic()

        def stuck() -> bool:
            if time.monotonic() - asked < ENGINE_STOP_SECONDS:
                return False
            leaving = stop is not None and stop.is_set()
            return leaving or not isinstance(engine, StepEngine) or engine.stuck(asked)

        if await self._engine_ended(task_ids, stuck):
            return
        if isinstance(engine, StepEngine):
            log.warning("task(s) %s: the engine call did not stop in time; aborting it", task_ids)
            engine.abort()
            aborted = time.monotonic()
            if await self._engine_ended(
                task_ids, lambda: time.monotonic() - aborted >= ENGINE_ABORT_SECONDS
            ):
                return
        self._abandoned(task_ids)

    async def _engine_ended(self, task_ids: list[str], give_up: Callable[[], bool]) -> bool:
        """Whether the engine call of ``task_ids`` ends before ``give_up()``."""
        while not self._engine_tasks.isdisjoint(task_ids):
            if give_up():
                return False
            await asyncio.sleep(ENGINE_STOP_POLL_SECONDS)
        return True

    def _abandoned(self, task_ids: list[str]) -> None:
        # A thread cannot be killed: stop claiming so the supervisor replaces this process.
        log.warning("task(s) %s: the engine is still running after being abandoned", task_ids)
        self.tainted = True

    def engine_started(self, task_ids: list[str]) -> None:
        self._engine_tasks.update(task_ids)

    def engine_ended(self, task_ids: list[str]) -> None:
        self._engine_tasks.difference_update(task_ids)

    def ran_for(self, model: str, seconds: float) -> None:
        """A call's run time, the margin a task of ``model`` needs left to be started."""
        self._run_seconds[model].append(seconds)

    async def _supervise(
        self,
        task: Task,
        work: asyncio.Task[None],
        lost: asyncio.Event,
        stop: asyncio.Event | None,
        job_stop: threading.Event,
        computed: asyncio.Event,
    ) -> None:
        remaining = max(0.0, (task.deadline_at - now_ms()) / 1000)
        waiters: set[asyncio.Future[Any]] = {work, asyncio.ensure_future(lost.wait())}
        computing = asyncio.ensure_future(computed.wait())
        waiters.add(computing)
        stop_waiter: asyncio.Future[Any] | None = None
        if stop is not None:
            stop_waiter = asyncio.ensure_future(stop.wait())
            waiters.add(stop_waiter)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + remaining
        grace_deadline: float | None = None
        try:
            while not work.done():
                limit = deadline if grace_deadline is None else min(deadline, grace_deadline)
                await asyncio.wait(
                    waiters, timeout=max(0.0, limit - loop.time()), return_when="FIRST_COMPLETED"
                )
                if work.done():
                    break
                if lost.is_set():
                    # Also how a cancel arrives: the task is no longer ``processing``.
                    job_stop.set()
                    work.cancel()
                    await say_given_up(self, task, "its run is abandoned")
                    return
                if computing.done() and deadline != float("inf"):
                    deadline = float("inf")  # only its outputs' storing remains
                    waiters.discard(computing)
                if loop.time() >= deadline:
                    job_stop.set()
                    work.cancel()
                    if await self.end_task(task, self.lifecycle.time_out):
                        log.info("task %s timed out", task.id)
                    return
                if stop_waiter is not None and stop_waiter.done() and grace_deadline is None:
                    grace_deadline = loop.time() + self.settings.shutdown_grace_seconds
                    waiters.discard(stop_waiter)
                    log.info("task %s: finishing before shutdown", task.id)
                elif grace_deadline is not None and loop.time() >= grace_deadline:
                    job_stop.set()
                    work.cancel()
                    await self.release_task(task)
                    return
            await work
        finally:
            for waiter in waiters:
                if waiter is not work:
                    waiter.cancel()

    async def _execute(
        self, task: Task, job_stop: threading.Event, computed: asyncio.Event
    ) -> None:
        # Storage and database faults before and after the engine are the service's own:
        # retried, then the task is requeued unharmed. Errors of the engine itself are not.
        progress = ProgressRecorder(
            self.db, task.id, self.worker_id, self.settings.progress_interval_seconds
        )
        in_engine = False
        try:
            images = await retry_infrastructure(
                lambda: self.load_inputs(task),
                what=f"task {task.id}: loading its inputs",
                budget_seconds=self.settings.fault_retry_seconds,
            )
            in_engine = True
            engine = await self.load_engine(task.model)
            job = EngineJob(
                task_id=task.id,
                model=task.model,
                params=task.params,
                images=images,
                report=tracing.steps(progress.report),
                deadline=task.deadline_at / 1000,
                stop=job_stop,
                request=self.request_of(task),
            )
            started = time.monotonic()
            with tracing.span("genhook.engine.run", {"genhook.model": task.model}):
                async with progress.running():
                    if isinstance(engine, AsyncEngine):
                        result = await engine.run_async(job)
                    else:
                        result = await asyncio.to_thread(self._run_engine, engine, job)
            in_engine = False
            computed.set()
            keys = await self.store_outputs(task, result)
            self.ran_for(task.model, time.monotonic() - started)
        except Exception as error:
            # An engine that stopped at the deadline (TIMEOUT) ends the task as the
            # supervisor would; every other outcome as the rules say (outcomes.py).
            await end_failed(self, task, error, in_engine=in_engine)
            return
        cost = None if result.cost_usd is None else int(result.cost_usd * 1_000_000)
        if isinstance(engine, AsyncEngine):
            flags = [output.nsfw for output in result.outputs]
            item = Completion(task.id, keys, flags, result.info, cost)
            done = await self._completer.submit(item)
            if done:
                await discard_inputs(self.storage, task.inputs)
        else:
            flags = [output.nsfw for output in result.outputs]
            item = Completion(task.id, keys, flags, result.info, cost, result.stt_result)
            done = await self._complete(task, item)
        if not done:
            await self.discard_outputs(task.id, keys)

    async def _complete(self, task: Task, item: Completion) -> bool:
        """Record a completion; when another task was waiting at the last claim, claim it in
        the same transaction (one write-lock turn fewer per task on SQLite).

        Only the one-at-a-time loop does so, and not once it is stopping. A failed combined
        transaction is retried as the plain completion (as ``end_task`` retries any), so a retry
        never claims a second task.
        """
        stop = self._chain_stop
        if stop is None or stop.is_set() or self.tainted or not self._more or self._next:
            return await self._complete_plain(task, item)
        inputs: dict[str, dict[str, bytes]] = {}
        try:
            claim = await self.lifecycle.claim(
                self.worker_id,
                self._models,
                limits=self.batch_sizes,
                reserve_ms=self.reserve_ms(),
                inputs=inputs,
                hold_ms=self.hold_ms(),
                affinity=self.preference(),
                complete=[item],
            )
        except Exception as error:
            if not is_infrastructure_error(error):
                raise
            log.warning("task %s: recording its outcome failed (%s); retrying", task.id, error)
            done = await self._complete_plain(task, item)
            # A commit that failed only in its reply may have claimed a task all the same:
            # give back what this worker holds, unless its own task is still held (the
            # outcome was not recorded; the leases then requeue both, as today).
            with contextlib.suppress(Exception):
                if not await self.lifecycle.held_of([task.id], self.worker_id):
                    await self.lifecycle.release_owner(self.worker_id, lost=False)
            return done
        (done,), self._next, self._more = claim.done, claim.tasks, claim.more
        self.prefetched.update(inputs)
        if done:
            await discard_inputs(self.storage, task.inputs)
        return done

    async def _complete_plain(self, task: Task, item: Completion) -> bool:
        return await self.end_task(
            task,
            self.lifecycle.complete,
            outputs=item.outputs,
            nsfw=item.nsfw,
            info=item.info,
            stt_result=item.stt_result,
            upstream_cost_micros=item.upstream_cost_micros,
        )

    async def _release_next(self) -> None:
        """Give back the tasks claimed with the last completion that the loop will not run."""
        tasks, self._next = self._next, []
        for task in tasks:
            self.prefetched.pop(task.id, None)
            await self.release_task(task)

    async def release_task(self, task: Task) -> None:
        """Give a task back at shutdown, unharmed (no lost lease counted)."""
        with contextlib.suppress(Exception):
            await retry_infrastructure(
                lambda: self.lifecycle.release(task.id, self.worker_id),
                what=f"task {task.id}: releasing",
                budget_seconds=self.settings.fault_retry_seconds,
            )
            log.info("task %s: released (worker %s stopping)", task.id, self.worker_id)

    async def end_task(self, task: Task, transition: Any, *args: Any, **kwargs: Any) -> bool:
        """A terminal transition, retried through database faults while the lease lasts, so a
        blip neither loses the outcome nor costs the task a lost lease."""
        try:
            done: bool = await retry_infrastructure(
                lambda: transition(task.id, self.worker_id, *args, **kwargs),
                what=f"task {task.id}: recording its outcome",
                budget_seconds=self.settings.fault_retry_seconds,
            )
        except Exception as error:
            if not is_infrastructure_error(error):
                raise
            log.error("task %s: could not record its outcome (%s); its lease will", task.id, error)
            return False
        if done:
            await discard_inputs(self.storage, task.inputs)
        return done

    async def discard_outputs(self, task_id: str, keys: list[str]) -> None:
        """Delete the stored outputs of a task whose completion was not recorded (canceled,
        lease lost), unless an earlier try of a retried completion did commit them."""
        if keys and not await self._outputs_recorded(task_id, keys):
            for key in keys:
                with contextlib.suppress(Exception):
                    await self.storage.delete(key)

    async def _outputs_recorded(self, task_id: str, keys: list[str]) -> bool:
        """Whether an earlier try of a retried completion did commit these outputs."""
        if not keys:
            return False
        with contextlib.suppress(Exception):
            async with self.db.read() as session:
                outputs = await reads.outputs_of(session, task_id)
            return set(keys) <= set(outputs or [])
        return True  # unknown: keep the blobs rather than risk deleting delivered outputs

    async def requeue(
        self, task: Task, error: BaseException, *, give_time_back: bool = False
    ) -> None:
        """Give a task back after a fault of the service's own, unharmed, after a backoff;
        ``give_time_back``: its deadlines also move on by the time this run and the backoff
        cost it (its outputs could not be stored: no ``timeout`` for a storage outage)."""
        delay = backoff_delay(task.attempts, 1.0, 30.0)
        extend = 0
        if give_time_back:
            extend = max(0, now_ms() - (task.started_at or now_ms())) + int(delay * 1000)
        log.warning(
            "task %s: storage or database fault (%s); requeued in %.1f s", task.id, error, delay
        )
        with contextlib.suppress(Exception):
            await retry_infrastructure(
                lambda: self.lifecycle.release(
                    task.id, self.worker_id, delay_seconds=delay, extend_ms=extend
                ),
                what=f"task {task.id}: requeueing",
                budget_seconds=self.settings.fault_retry_seconds,
            )

    def _run_engine(self, engine: Engine, job: EngineJob) -> EngineResult:
        self.engine_started([job.task_id])
        try:
            return engine.run(job)
        finally:
            self.engine_ended([job.task_id])

    async def load_inputs(self, task: Task) -> list[bytes]:
        images: list[bytes] = []
        prefetched = self.prefetched.pop(task.id, {})
        for index, item in enumerate(task.inputs):
            if "blob" in item:
                data = prefetched.get(item["blob"])
                blob = (data, "") if data is not None else await self._inputs.get(item["blob"])
                if blob is None:
                    raise TaskFailure(ErrorCode.INTERNAL_ERROR, f"input image {index} is missing")
                images.append(blob[0])
                continue
            from genhook.net import fetch_input_image  # aiohttp, on a task's first URL input

            try:
                images.append(
                    await fetch_input_image(
                        item["url"],
                        policy=self.policy,
                        max_bytes=self.settings.input_max_bytes,
                        timeout=self.settings.input_fetch_timeout_seconds,
                        ssl_context=self._ssl_context,
                    )
                )
            except TaskFailure as failure:
                label = item.get("field") or f"images[{index}]"
                raise TaskFailure(failure.code, f"{label}: {failure.message}") from None
        return images

    async def store_outputs(self, task: Task, result: EngineResult) -> list[str]:
        keys: list[str] = []
        try:
            for output in result.outputs:
                key = new_blob_key("outputs", extension_of(output.content_type))
                blob: dict[str, str | int | float] = {
                    "genhook.blob.bytes": len(output.data),
                    "genhook.blob.kind": "output",
                }
                with tracing.span("genhook.blob.put", blob):
                    await retry_infrastructure(
                        lambda: self.storage.put(key, output.data, output.content_type),  # noqa: B023
                        what=f"task {task.id}: storing an output",
                        budget_seconds=self.settings.fault_retry_seconds,
                    )
                keys.append(key)
        except BaseException as error:
            for key in keys:
                with contextlib.suppress(Exception):
                    await self.storage.delete(key)
            if isinstance(error, Exception) and is_infrastructure_error(error):
                self._storage_refused()
                raise OutputsNotStored(error) from error
            raise
        return keys
