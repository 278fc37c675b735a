"""The worker and its one loop: per model, N slots (its concurrency); a free slot claims a
batch of 1 to the model's ``max_batch_size`` tasks, which ``run_batch`` runs.

The package's parts, each in one place: this loop (``Worker``: claims, slots, the services
a run uses: engines, inputs, outputs, completions), the batch runner (``batch.py``), the
outcome rules (``outcomes.py``), model residency and affinity (``affinity.py``) and the
leases (``leases.py``).

The models that run one call at a time share one slot: one CPU task at a time per worker,
and ``genhook serve`` starts several worker processes, so CPU-heavy engines never block the
API's event loop. The engine runs in a thread of the worker process, so heartbeats keep
flowing while it computes. Models with ``ModelSpec.concurrency`` above 1 have that many
slots each: an ``AsyncEngine``'s calls on the loop, a thread-safe synchronous engine's in
threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from genhook import tracing
from genhook.db import Task, now_ms
from genhook.db.wakeups import TASKS, Waiter, Wake
from genhook.engines.base import (
    Engine,
    EngineResult,
    StepEngine,
    stored_request,
)
from genhook.engines.registry import claimable_models
from genhook.errors import ErrorCode, TaskFailure
from genhook.faults import is_infrastructure_error, retry_infrastructure
from genhook.net import client_ssl_context
from genhook.retry import backoff_delay
from genhook.runtime.services import Services
from genhook.storage import DatabaseBlobStore
from genhook.storage.blobs import extension_of, new_blob_key
from genhook.storage.inputs import discard_inputs, keeps_inputs
from genhook.tasks.group_commit import GroupCommit
from genhook.tasks.lifecycle import NO_PREFERENCE, Completion, Lifecycle, Preference
from genhook.tasks.store import reads
from genhook.tasks.worker import affinity
from genhook.tasks.worker.batch import run_batch
from genhook.tasks.worker.leases import LeaseKeeper
from genhook.tasks.worker.outcomes import OutputsNotStored

log = logging.getLogger(__name__)

# Most tasks one claim takes for a model's free slots, so one claim never holds the loop long.
CLAIM_BATCH = 32
# While a model's queue has work, its slots are claimed in batches of at least its limit
# divided by this (8 of 64): a claim per finished task would cost a transaction per task.
CLAIM_BATCH_DIVISOR = 8


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
        # Tasks of each model one process runs at once: its slots (``_run``).
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
        # Wake-ups the loop has read, and an event set at the next one: a batch being formed
        # claims more when work arrived (``arrival``).
        self.heard = 0
        self._heard = asyncio.Event()
        # Batches being formed now, and an event set when that number changes: meanwhile
        # the worker counts as idle, so a submit's wake-up may be sent to it alone.
        self._filling = 0
        self._filling_changed = asyncio.Event()
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

    def loaded(self, model: str) -> bool:
        """The model's engine is loaded in this process."""
        return model in self._engines

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
        """The one loop: per model group, claim while a slot is free, each slot's claim a
        batch of 1 to the model's batch size, run by ``run_batch``; until ``stop``, then the
        slots' tasks finish first."""
        if any(limit > 1 for limit in self.limits.values()):
            # A synchronous engine's calls run in the loop's threads: enough of them for
            # every model's calls at once (threads start only when needed).
            threads = sum(self.limits.values()) + 4
            if threads > min(32, (os.cpu_count() or 1) + 4):
                executor = ThreadPoolExecutor(threads, thread_name_prefix="engine")
                asyncio.get_running_loop().set_default_executor(executor)
        running: dict[asyncio.Future[Slot], str] = {}
        # When a group's last claim found no more waiting (loop time): it is asked again
        # only after a wake-up or ``worker_poll_seconds``, not each time a slot finishes.
        idle_since: dict[tuple[str, ...], float] = {}
        woken_at = float("-inf")
        claimed_at: dict[tuple[str, ...], float] = {}  # each group's last claim by the loop
        loop = asyncio.get_running_loop()
        stopping = asyncio.ensure_future(stop.wait())
        failures = 0
        waited = False  # after a wait that was not for this worker alone: read first
        try:
            while not stop.is_set() and not self.tainted:
                poll = self.idle_poll()
                for finished in [slot for slot in running if slot.done()]:
                    del running[finished]
                    slot = _reaped(finished)
                    if slot is None:
                        continue
                    # What its last claim saw stands unless the loop claimed for its group,
                    # or heard a wake-up, since.
                    group = tuple(slot.models)
                    if slot.claimed_at < max(woken_at, claimed_at.get(group, woken_at)):
                        continue
                    if slot.more:
                        idle_since.pop(group, None)
                    else:
                        idle_since[group] = slot.claimed_at
                claimed = False
                for models, free in _free_slots(self.limits, list(running.values())):
                    group = tuple(models)
                    if loop.time() - idle_since.get(group, float("-inf")) < poll:
                        continue
                    if group not in idle_since and free < _min_batch(self.limits, models):
                        continue  # a busy queue: wait for more free slots, then take a batch
                    if waited and not running and not await self._any_runnable(models):
                        idle_since[group] = loop.time()
                        continue  # after a wait, read first: an idle worker writes nothing
                    if not await self.storage_ready():
                        idle_since[group] = loop.time()
                        continue  # outputs cannot be stored now: claim nothing
                    try:
                        batches, more = await self._claim(
                            models, free, _chains(self.limits, models)
                        )
                        failures = 0
                    except Exception as error:
                        failures += 1
                        if is_infrastructure_error(error):
                            log.warning(
                                "worker %s: claim failed (%s); retrying", self.worker_id, error
                            )
                        else:
                            log.exception("worker %s: claim failed; retrying", self.worker_id)
                        retry = backoff_delay(failures, poll, 2.0)
                        idle_since[group] = loop.time() - poll + retry
                        continue
                    claimed_at[group] = loop.time()
                    if more:
                        idle_since.pop(group, None)
                    else:
                        idle_since[group] = loop.time()
                    for tasks in batches:
                        slot = Slot(models, _chains(self.limits, models), more, loop.time(), tasks)
                        running[asyncio.ensure_future(self._run_slot(slot, stop))] = tasks[0].model
                    claimed = claimed or bool(batches)
                if claimed:
                    waited = False
                    continue
                # Idle (a writer may take it alone) only with a slot free, or a batch being
                # formed, for what it is sent; not either when it would hold a task back for
                # another worker (affinity).
                free = bool(_free_slots(self.limits, list(running.values()))) or self._filling
                idle = bool(free) and not self.hold_ms()
                self._filling_changed.clear()
                waking = asyncio.ensure_future(self.wakeup.wait(poll, idle=idle))
                changed = asyncio.ensure_future(self._filling_changed.wait())
                waiters: set[asyncio.Future[Any]] = {stopping, waking, changed, *running}
                await asyncio.wait(waiters, return_when="FIRST_COMPLETED")
                changed.cancel()
                if waking.done() and not waking.cancelled():
                    wake = waking.result()
                    log.debug("worker %s: woken (%s)", self.worker_id, wake.value)
                    if wake is not Wake.TIMEOUT:
                        idle_since.clear()  # woken: a task may be waiting now, ask every queue
                        woken_at = loop.time()
                        self._hear()
                    # A writer that took this worker alone (Wake.TARGETED) sent it a task: it
                    # claims at once. On PostgreSQL a claim that finds nothing writes nothing
                    # and locks nothing (SKIP LOCKED), so a worker woken by NOTIFY claims at
                    # once too. After any other wake-up, and the poll, it reads first: a
                    # broadcast wakes every idle worker while only one gets the task.
                    waited = wake is not Wake.TARGETED and not (
                        wake is Wake.BROADCAST and self.db.is_postgres
                    )
                waking.cancel()
            if running:
                await asyncio.wait(running)
        finally:
            stopping.cancel()

    async def _any_runnable(self, models: list[str]) -> bool:
        try:
            return await self.lifecycle.any_runnable(models, self.reserve_ms(), self.hold_ms())
        except Exception:
            return True  # let the claim report the fault

    async def _claim(
        self, models: list[str], free: int, look_on: bool
    ) -> tuple[list[list[Task]], bool]:
        """Work for ``free`` slots of ``models``, and whether more was waiting: a task each,
        or a batch each for a batched model (its first task and up to its batch size less
        one more of its model), in one claim per slot, or one for a model's free slots.
        ``look_on``: a claim of one task also reads whether another waits (a slot that
        chains its claims needs to know; the others count a full claim as more)."""
        terms: dict[str, Any] = dict(
            reserve_ms=self.reserve_ms(),
            inputs=self.prefetched,
            hold_ms=self.hold_ms(),
            affinity=self.preference(),
            look_on=look_on,
        )
        if len(models) == 1 and models[0] not in self.batch_sizes and not look_on:
            # A model's free slots in one claim, a task each.
            claim = await self.lifecycle.claim(
                self.worker_id, models, limits={models[0]: free}, **terms
            )
            return [[task] for task in claim.tasks], len(claim.tasks) == free
        batches: list[list[Task]] = []
        more = False
        for _ in range(free):
            claim = await self.lifecycle.claim(
                self.worker_id, models, limits=self.batch_sizes, **terms
            )
            more = claim.more or (not look_on and bool(claim.tasks))
            if not claim.tasks:
                break
            batches.append(claim.tasks)
        return batches, more

    async def _run_slot(self, slot: Slot, stop: asyncio.Event) -> Slot:
        """A slot's batch, then each batch its completions claimed with them, until a claim
        finds no more waiting; a batch claimed so is given back once the worker stops."""
        try:
            first = True
            while slot.next and not self.tainted and (first or not stop.is_set()):
                tasks, slot.next, first = slot.next, [], False
                await run_batch(self, tasks, stop, slot)
        finally:
            tasks, slot.next = slot.next, []
            for task in tasks:
                self.prefetched.pop(task.id, None)
                await self.release_task(task)
        return slot

    async def run_turn(self, stop: asyncio.Event | None = None) -> bool:
        """One turn of a slot, as the loop takes it: a claim of any of this worker's models
        (a task, or a batch) and its run; whether it found work. Tests and benchmarks step
        a worker with it."""
        if not await self.storage_ready():
            return False
        batches, _ = await self._claim(self._models, 1, look_on=True)
        if not batches:
            log.debug("worker %s: claim found no task", self.worker_id)
            return False
        await run_batch(self, batches[0], stop, None)
        return True

    async def complete(
        self, model: str, items: list[Completion], stop: asyncio.Event | None, slot: Slot | None
    ) -> list[bool]:
        """Record a call's completions, retried through database faults while the leases
        last: in the slot's next claim when it saw more waiting (one write-lock turn fewer
        per task on SQLite), in a shared group commit for a model with several calls at once,
        else in one transaction of their own. Whether each was recorded."""
        stopping = stop is not None and stop.is_set()
        if (
            slot is not None
            and slot.chain
            and slot.more
            and not slot.next
            and not stopping
            and not self.tainted
        ):
            return await self._complete_and_claim(model, items, slot)

        async def write() -> list[bool]:
            if self.limits.get(model, 1) > 1:  # many calls in flight: shared transactions
                return list(await asyncio.gather(*map(self._completer.submit, items)))
            return await self.lifecycle.complete_many(self.worker_id, items)

        try:
            return await retry_infrastructure(
                write,
                what=f"{len(items)} task(s): recording their outcome",
                budget_seconds=self.settings.fault_retry_seconds,
            )
        except Exception as error:
            if not is_infrastructure_error(error):
                raise
            ids = [item.task_id for item in items]
            log.error("task(s) %s: could not record the outcome (%s); the leases will", ids, error)
            return [False] * len(items)

    async def _complete_and_claim(
        self, model: str, items: list[Completion], slot: Slot
    ) -> list[bool]:
        """The completions and the slot's next claim in one transaction. A failed combined
        transaction is retried as the plain completion, so a retry never claims twice."""
        inputs: dict[str, dict[str, bytes]] = {}
        try:
            claim = await self.lifecycle.claim(
                self.worker_id,
                slot.models,
                limits=self.batch_sizes,
                reserve_ms=self.reserve_ms(),
                inputs=inputs,
                hold_ms=self.hold_ms(),
                affinity=self.preference(),
                complete=items,
            )
        except Exception as error:
            if not is_infrastructure_error(error):
                raise
            log.warning("recording an outcome failed (%s); retrying", error)
            slot.more = False
            done = await self.complete(model, items, None, None)
            # A commit that failed only in its reply may have claimed tasks all the same:
            # give back what this worker holds and does not know of.
            with contextlib.suppress(Exception):
                await self.lifecycle.release_owner(
                    self.worker_id, lost=False, keep=self.keeper.held()
                )
            return done
        slot.next, slot.more = claim.tasks, claim.more
        slot.claimed_at = asyncio.get_running_loop().time()
        self.prefetched.update(inputs)
        return claim.done

    def _hear(self) -> None:
        self.heard += 1
        event, self._heard = self._heard, asyncio.Event()
        event.set()

    async def arrival(self, since: int, timeout: float) -> bool:
        """Whether a wake-up was read after the ``since``-th, waiting up to ``timeout``."""
        if self.heard != since:
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._heard.wait()
            return True
        return False

    @contextlib.contextmanager
    def filling(self) -> Iterator[None]:
        """A batch is being formed meanwhile: the loop's wait counts the worker idle."""
        self._filling += 1
        self._filling_changed.set()
        try:
            yield
        finally:
            self._filling -= 1
            self._filling_changed.set()

    async def close_engines(self) -> None:
        """Close what engines hold on the loop (an upstream engine's connection pool)."""
        for engine in self._engines.values():
            close = getattr(engine, "aclose", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()

    def reserve_ms(self) -> dict[str, int]:
        """Per model, the time a task needs left before its deadline to be worth starting."""
        margin = self.settings.task_start_margin_seconds
        return {
            model: int(1000 * max([margin, *self._run_seconds.get(model, ())]))
            for model in self._models
        }

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


@dataclass
class Slot:
    """One of a model group's slots (its concurrency), between its claims: what its claims
    take, whether the last saw more waiting, and the batch it claimed with its last
    completion, which it runs next."""

    models: list[str]
    # Completes its batch and claims the next in one transaction (a group of one slot).
    chain: bool
    more: bool
    claimed_at: float  # the loop's time
    next: list[Task]


def _chains(limits: dict[str, int], models: list[str]) -> bool:
    """Whether a group's slot records its completions with its next claim: the group of
    models that run one call at a time; the others share group commits."""
    return all(limits[model] <= 1 for model in models)


def _reaped(finished: asyncio.Future[Slot]) -> Slot | None:
    if finished.cancelled():
        return None
    if finished.exception() is not None:
        log.error("a slot's run failed", exc_info=finished.exception())
        return None
    return finished.result()


def _free_slots(limits: dict[str, int], running: list[str]) -> list[tuple[list[str], int]]:
    """(models, how many) to claim: the models of one call at a time together for one slot,
    each other model its own slots."""
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
