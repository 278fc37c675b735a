"""The task state machine and its durable transitions.

created -> processing -> completed | failed | timeout | canceled; processing -> created when
a lease is lost (up to ``max_lease_losses``); the states live in ``genhook.task_states``.
Every transition is one conditional UPDATE, so two workers or two sweepers racing on one
task cannot both win, and a terminal state is final.
The terminal transition deletes the input blobs, writes the usage line and publishes the
outbox event in the same transaction (``tasks/store/terminal.py``); every statement that
writes a task runs in the task store (``tasks/store/``).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from genhook import metrics
from genhook.config import Settings
from genhook.db import Database, Task, now_ms, wakeups
from genhook.db.driver import SessionTx, Tx
from genhook.errors import ErrorCode
from genhook.faults import is_infrastructure_error
from genhook.files import disk_problem
from genhook.statuses import TaskStatus
from genhook.storage import BlobStore
from genhook.task_states import (
    CANCELED_MESSAGE,
    NOT_STARTED_MESSAGE,
    TIMEOUT_MESSAGE,
)
from genhook.tasks.liveness import DeathWatch
from genhook.tasks.outage import OutageRecord
from genhook.tasks.outbox import Outbox, TaskStarted, publish_ended, webhook_outbox
from genhook.tasks.store import reads, writes
from genhook.tasks.store.hot_path import (
    HEARTBEAT,
    HELD,
    claim_candidates,
    claim_params,
    claimed,
    keys_params,
    read_inputs,
    runnable_one,
    runnable_params,
    take_first,
    take_ids,
)
from genhook.tasks.store.terminal import (
    a_batch_of,
    complete_in,
    end_where,
    held_by,
    owned_active,
)

log = logging.getLogger(__name__)

__all__ = ["Claim", "Completion", "Lifecycle"]

# The most tasks one reconciliation pass publishes missing terminal events for.
MISSING_BATCH = 500


# Affinity's terms of a claim: the models whose tasks go first, how long a task waits before
# it goes first whatever its model, and the (model, adapter) pairs held, whose tasks go first
# among their model's (``tasks/worker/affinity.py``).
Preference = tuple[tuple[str, ...], int, tuple[tuple[str, str], ...]]
NO_PREFERENCE: Preference = ((), 0, ())


@dataclass(frozen=True, slots=True)
class Completion:
    task_id: str
    outputs: list[str]
    nsfw: list[bool]
    info: dict[str, Any]
    upstream_cost_micros: int | None = None
    stt_result: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Claim:
    """What one claim took and saw: ``tasks``, oldest first (the first chosen by affinity);
    ``more``, whether another task was runnable then; ``done``, the outcome of each
    completion recorded in its transaction."""

    tasks: list[Task]
    more: bool
    done: list[bool]


@dataclass
class Lifecycle:
    settings: Settings
    db: Database
    storage: BlobStore
    # Set by a worker that is leaving at once (its supervisor died): a claim that has not
    # yet written takes nothing, so what ``release_owner`` then gives back is all it held.
    closed: bool = False
    # When the outage still going on began, here and in shared memory (a restarted sweeper
    # reads it there); made at the first sweep.
    _outage: OutageRecord | None = None
    # Standalone workers on PostgreSQL whose database session is gone (``tasks/liveness.py``).
    _deaths: DeathWatch = field(default_factory=DeathWatch)
    # Where the task's events go: webhook deliveries (``tasks/outbox.py``).
    outbox: Outbox = field(default_factory=webhook_outbox)

    async def claim(
        self,
        worker_id: str,
        models: Sequence[str],
        *,
        limits: Mapping[str, int] | None = None,
        reserve_ms: Mapping[str, int] | None = None,
        inputs: dict[str, dict[str, bytes]] | None = None,
        hold_ms: Mapping[str, int] | None = None,
        affinity: Preference = NO_PREFERENCE,
        look_on: bool = True,
        complete: Sequence[Completion] = (),
    ) -> Claim:
        """The worker's one claim: runnable tasks of ``models`` taken under a lease in one
        write transaction, after recording ``complete`` in it.

        The first task is the oldest runnable one, ordered by ``affinity`` (the models and
        adapters the worker holds go first, ``tasks/worker/affinity.py``); ``hold_ms``: per
        model, how long its task must have waited before this worker takes it. Up to
        ``limits[model]`` tasks of the first task's model are taken in all (a batch, or the
        free slots of a model that runs several calls at once; 1 by default), oldest first.
        ``reserve_ms`` is the time a model's task needs: a task with less left before its
        deadline is never started (it would only time out mid-run); the sweeper expires it.
        ``inputs``, when given, receives the tasks' input images, read in the same
        transaction.

        ``look_on``: also say whether another task was runnable then (one read), so that a
        worker that knows none was, and has not been woken since, need not claim again (on
        SQLite a write) after its task. ``complete``: completions recorded first, in the same
        transaction: on SQLite every write transaction takes the database's single write
        lock, handed between processes, so a worker that knows another task waits saves a
        BEGIN, a COMMIT and a hand-over per task.
        """
        if not models and not complete:
            return Claim([], False, [])
        async with self.db.transaction() as tx:
            done: list[bool] = []
            if complete:
                done = await complete_in(
                    tx, self.settings, self.storage, self.outbox, worker_id, complete, now_ms()
                )
            tasks, more = await self._claim_in(
                tx, worker_id, models, limits or {}, reserve_ms, inputs, hold_ms, affinity, look_on
            )
            return Claim(tasks, more, done)

    async def _claim_in(
        self,
        tx: Tx,
        worker_id: str,
        models: Sequence[str],
        limits: Mapping[str, int],
        reserve_ms: Mapping[str, int] | None,
        inputs: dict[str, dict[str, bytes]] | None,
        hold_ms: Mapping[str, int] | None,
        affinity: Preference,
        look_on: bool,
    ) -> tuple[list[Task], bool]:
        """The claim of ``claim`` in the caller's write transaction."""
        if self.closed or not models:
            return [], False
        key = tuple(models)
        preferred, overdue_ms, adapters = affinity
        params = claim_params(
            key,
            worker_id,
            now_ms(),
            self._lease_ms,
            reserve_ms or {},
            hold_ms,
            preferred,
            overdue_ms,
            adapters,
        )
        limit = limits.get(key[0], 1)
        if len(key) == 1 and not preferred and limit > 1:
            # One model, nothing preferred: its oldest tasks, up to the limit, by their ids.
            tasks = await self._take(tx, key, params, limit)
            more = len(tasks) == limit
        else:
            row = await take_first(
                tx,
                key,
                params,
                preferred,
                len(adapters),
                fair=self._fair,
                postgres=self.db.is_postgres,
            )
            if row is None:
                return [], False
            tasks = claimed([row])
            more = look_on and await tx.first(runnable_one(key), params) is not None
            limit = limits.get(tasks[0].model, 1)
            if limit > 1 and (more or not look_on):
                # The rest of a batch: the first task's model, whatever its hold.
                company = (tasks[0].model,)
                params = claim_params(
                    company, worker_id, params["now"], self._lease_ms, reserve_ms or {}
                )
                tasks += await self._take(tx, company, params, limit - 1)
        await self._started(tx, tasks, params["now"], inputs)
        return tasks, more

    async def claim_more(
        self,
        worker_id: str,
        model: str,
        limit: int,
        reserve_ms: Mapping[str, int] | None = None,
        inputs: dict[str, dict[str, bytes]] | None = None,
        hold_ms: Mapping[str, int] | None = None,
    ) -> list[Task]:
        """Take up to ``limit`` more of ``model``'s oldest runnable tasks in one transaction:
        the claim that fills a batch being formed (``SKIP LOCKED`` on PostgreSQL, so
        competing workers split the queue rather than wait for each other)."""
        if self.closed or limit < 1:
            return []
        key = (model,)
        params = claim_params(key, worker_id, now_ms(), self._lease_ms, reserve_ms or {}, hold_ms)
        async with self.db.transaction() as tx:
            tasks = await self._take(tx, key, params, limit)
            await self._started(tx, tasks, params["now"], inputs)
            return tasks

    async def _take(
        self, tx: Tx, key: tuple[str, ...], params: dict[str, Any], limit: int
    ) -> list[Task]:
        """Up to ``limit`` of the oldest runnable tasks of ``key``, oldest first.

        The ids are selected first (locked, skipping those another claim holds), then taken
        by a statement naming each: PostgreSQL may run an ``IN (... LIMIT n)`` subquery more
        than once per UPDATE and so take more than ``limit`` rows.
        """
        if self.closed or limit < 1:
            return []
        chosen = await tx.rows(claim_candidates(key, self._fair), params | {"limit": limit})
        ids = [row["id"] for row in chosen]
        if not ids:
            return []
        rows = await tx.rows(take_ids(len(ids)), params | keys_params(ids, "id"))
        return sorted(claimed(rows), key=lambda task: (task.available_at, task.created_at))

    async def _started(
        self,
        tx: Tx,
        tasks: list[Task],
        now: int,
        inputs: dict[str, dict[str, bytes]] | None,
    ) -> None:
        """What a claim does for the tasks it took: their processing events (for a task that
        asks for them), their input images read, the metric."""
        for task in tasks:
            if task.webhook_events:
                await self.outbox.task_started(tx, TaskStarted(task, now))
        if inputs is not None and tasks:
            await read_inputs(tx, tasks, inputs)
        metrics.tasks_started(tasks)

    async def any_runnable(
        self,
        models: Sequence[str],
        reserve_ms: Mapping[str, int] | None = None,
        hold_ms: Mapping[str, int] | None = None,
    ) -> bool:
        """Whether a claim would find a task: a read, so an idle worker's poll writes nothing."""
        if not models:
            return False
        group = tuple(models)
        params = runnable_params(group, now_ms(), reserve_ms or {}, hold_ms)
        async with self.db.read() as session:
            return await session.scalar(runnable_one(group), params) is not None

    @property
    def _fair(self) -> bool:
        """Claims go in fair order across accounts (``tasks/fairness.py``), not oldest first."""
        return self.settings.scheduling == "fair"

    @property
    def _lease_ms(self) -> int:
        return int(self.settings.lease_seconds * 1000)

    async def heartbeat(self, task_id: str, worker_id: str) -> bool:
        """Extend the lease; False means it was lost (expired and taken, or ended)."""
        return task_id in await self.heartbeat_many([task_id], worker_id)

    async def heartbeat_many(self, task_ids: Sequence[str], worker_id: str) -> set[str]:
        """Extend the leases of ``task_ids`` in one statement; returns those still held."""
        now = now_ms()
        params = {"ids": list(task_ids), "owner": worker_id, "now": now}
        async with self.db.write() as session:
            connection = await session.connection()
            kept = await connection.execute(HEARTBEAT, params | {"until": now + self._lease_ms})
            return {task_id for (task_id,) in kept}

    async def held_of(self, task_ids: Sequence[str], worker_id: str) -> set[str]:
        """Those of ``task_ids`` still ``processing`` under this worker (a read, not a write)."""
        async with self.db.read() as session:
            connection = await session.connection()
            held = await connection.execute(HELD, {"ids": list(task_ids), "owner": worker_id})
            return {task_id for (task_id,) in held}

    async def release(
        self, task_id: str, worker_id: str, delay_seconds: float = 0, extend_ms: int = 0
    ) -> bool:
        """Give a task back without counting a lost lease (graceful shutdown, or a storage or
        database fault that is the service's own); ``delay_seconds`` before it is claimable;
        ``extend_ms`` moves its deadlines on (the time a storage outage cost it)."""
        now = now_ms()
        async with self.db.write() as session:
            released = await writes.release(
                session, task_id, worker_id, now, now + int(delay_seconds * 1000), extend_ms
            )
            # A delayed task is not claimable yet: a worker woken for it alone would claim
            # at once and find nothing. The poll finds it when it is due.
            if released and delay_seconds <= 0:
                await wakeups.notify(session, wakeups.TASKS)
        return bool(released)

    async def complete(
        self,
        task_id: str,
        worker_id: str,
        *,
        outputs: list[str],
        nsfw: list[bool],
        info: dict[str, Any],
        stt_result: dict[str, Any] | None = None,
        upstream_cost_micros: int | None = None,
    ) -> bool:
        item = Completion(task_id, outputs, nsfw, info, upstream_cost_micros, stt_result)
        (done,) = await self.complete_many(worker_id, [item])
        return done

    async def fail(
        self,
        task_id: str,
        worker_id: str,
        code: ErrorCode,
        message: str,
        info: dict[str, Any] | None = None,
    ) -> bool:
        values: dict[str, Any] = dict(
            status=TaskStatus.FAILED, error_code=int(code), error_message=message
        )
        if info:
            values["info"] = info
        return await self._finish(task_id, worker_id, values)

    async def time_out(self, task_id: str, worker_id: str | None = None) -> bool:
        values = dict(
            status=TaskStatus.TIMEOUT,
            error_code=int(ErrorCode.TIMEOUT),
            error_message=TIMEOUT_MESSAGE,
        )
        return await self._finish(task_id, worker_id, values)

    async def cancel(self, task_id: str, account_id: str) -> tuple[bool, Task | None]:
        """End an active task of ``account_id`` as ``canceled``, at once and not billed.

        A running task's worker learns it at its next heartbeat (its lease is gone), asks
        the engine to stop and abandons it, as at a deadline. Returns whether this call
        ended it, and the task as it now stands (None when unknown or foreign).
        """
        values = dict(
            status=TaskStatus.CANCELED,
            error_code=int(ErrorCode.CANCELED),
            error_message=CANCELED_MESSAGE,
        )
        task = await self._end(owned_active(task_id, account_id), values)
        if task is not None:
            return True, task
        async with self.db.read() as session:
            current = await reads.task_in(session, task_id)
        if current is None or current.account_id != account_id:
            return False, None
        return False, current

    async def complete_many(self, worker_id: str, items: Sequence[Completion]) -> list[bool]:
        """Several completions in one transaction: group commit for I/O-bound engines,
        whose many tasks in flight would otherwise each pay for a commit."""
        async with self.db.transaction() as tx:
            return await complete_in(
                tx, self.settings, self.storage, self.outbox, worker_id, items, now_ms()
            )

    async def _finish(
        self,
        task_id: str,
        worker_id: str | None,
        values: dict[str, Any],
        upstream_cost_micros: int | None = None,
    ) -> bool:
        """One terminal transition; False when the task is no longer ours to end."""
        conditions = held_by(task_id, worker_id)
        return await self._end(conditions, values, upstream_cost_micros) is not None

    async def _end(
        self, conditions: list[Any], values: dict[str, Any], upstream_cost_micros: int | None = None
    ) -> Task | None:
        async with self.db.write() as session:
            task = await self._end_in(session, conditions, values, upstream_cost_micros)
        if task is not None:
            metrics.task_finished(task)
        return task

    async def _end_in(
        self,
        session: AsyncSession,
        conditions: list[Any],
        values: dict[str, Any],
        upstream_cost_micros: int | None,
    ) -> Task | None:
        ended = await end_where(
            session,
            conditions,
            values,
            now_ms(),
            self.settings,
            self.storage,
            self.outbox,
            upstream_cost_micros,
        )
        return ended[0] if ended else None

    async def enqueue_missing(self, since: int, now: int) -> tuple[int, int | None]:
        """Reconciliation: publish ``TaskEnded`` for tasks that ended between ``since`` and
        ``now`` with a webhook but without a terminal delivery, a transaction each; returns
        how many, and where the next pass resumes when a full batch was found."""
        async with self.db.read() as session:
            tasks = await reads.ended_without(
                session, since, now, MISSING_BATCH, self.outbox.without_terminal_event
            )
        enqueued = 0
        for task in tasks:
            try:
                async with self.db.write() as session:
                    await publish_ended(
                        self.outbox, SessionTx(session), task, self.settings, self.storage, now
                    )
            except IntegrityError:
                continue  # enqueued meanwhile by the task's own transaction or another sweeper
            enqueued += 1
        resume = tasks[-1].finished_at if len(tasks) == MISSING_BATCH else None
        return enqueued, resume

    async def sweep(self) -> int:
        """Requeue or fail tasks whose lease expired, and time out tasks past their deadline.

        Safe to run in every process at once; each row changes under a conditional UPDATE.
        Returns the number of tasks changed.

        An outage of the service's own (the disk under its margin, the database unreachable)
        is not charged to the tasks: meanwhile nothing is timed out or requeued for a lost
        lease, and once it is over the tasks get back the time it took (``_forgive``).
        """
        now = now_ms()
        if self._outage is None:
            self._outage = OutageRecord(self.settings.resolved_database_url)
        if disk_problem(self.settings, self.db) is not None:
            self._outage.goes_on(now)
            return 0
        try:
            ended = self._outage.over(now)
            if ended is not None:
                await self._forgive(*ended, now)
                self._outage.clear()
            return await self._sweep(now)
        except Exception as error:
            if is_infrastructure_error(error):
                self._outage.goes_on(now)
            raise

    async def _forgive(self, since: int, until: int, now: int) -> None:
        """After an outage from ``since`` to ``until``: a task whose deadline fell inside it
        gets back the time it had left when it began, and a task whose lease ran out inside
        it is requeued without counting a lost lease (its worker could not renew it either)."""
        outage = until - since
        async with self.db.write() as session:
            counts = await writes.forgive_outage(session, since, until, now)
            if counts[1]:
                await wakeups.notify(session, wakeups.TASKS)
        log.log(
            logging.WARNING if any(counts) else logging.INFO,
            "an outage of %.1f s is over: %d deadline(s) extended, %d task(s) requeued uncharged",
            outage / 1000,
            *counts,
        )

    async def _sweep(self, now: int) -> int:
        if not await self._sweep_due(now):
            return 0
        changed = await self.expire_overdue(now)
        async with self.db.read() as session:
            expired = await reads.expired_leases(session, now)
        for task_id, owner, losses in expired:
            changed += int(await self._lose_lease(task_id, owner, losses, now, expired=True))
        if self.db.is_postgres:
            changed += await self._requeue_dead_owners(now)
        return changed

    async def _requeue_dead_owners(self, now: int) -> int:
        """Requeue the tasks of standalone workers whose database session is gone, without
        waiting out their leases (``genhook.tasks.liveness``)."""
        async with self.db.read() as session:
            held = await reads.held_by_live_owners(session)
            dead = set(await self._deaths.dead_owners(session, [row[1] or "" for row in held]))
        changed = 0
        for task_id, owner, losses in held:
            if owner in dead:
                changed += int(await self._lose_lease(task_id, owner, losses, now))
        return changed

    async def _sweep_due(self, now: int) -> bool:
        """Whether the sweep has anything to change: one read, the idle sweep's only cost."""
        async with self.db.read() as session:
            return await reads.sweep_due(session, now, postgres=self.db.is_postgres)

    async def expire_overdue(self, now: int, batch: int = 500, max_batches: int = 20) -> int:
        """Time out every active task past its deadline, and every waiting task past its start
        deadline (it never ran: nothing is billed), a batch per transaction.

        Set-based: one UPDATE ends a whole batch (a backlog of thousands ends in a few
        statements, not one transaction per task), and the callbacks are written with it.
        """
        changed = await self._expire(now, reads.overdue(now), TIMEOUT_MESSAGE, batch, max_batches)
        return changed + await self._expire(
            now, reads.unstarted(now), NOT_STARTED_MESSAGE, batch, max_batches
        )

    async def _expire(
        self, now: int, conditions: list[Any], message: str, batch: int, max_batches: int
    ) -> int:
        changed = 0
        for _ in range(max_batches):
            async with self.db.read() as session:  # read first: an idle sweep writes nothing
                if not await reads.any_task(session, conditions):
                    break
            values = dict(
                status=TaskStatus.TIMEOUT, error_code=int(ErrorCode.TIMEOUT), error_message=message
            )
            async with self.db.write() as session:
                tasks = await end_where(
                    session,
                    a_batch_of(conditions, batch),
                    values,
                    now,
                    self.settings,
                    self.storage,
                    self.outbox,
                )
            metrics.tasks_finished(tasks)
            if tasks:
                log.info("%d task(s) timed out: %s", len(tasks), message)
            changed += len(tasks)
            if len(tasks) < batch:
                break
        return changed

    async def release_owner(self, worker_id: str, *, lost: bool, keep: Collection[str] = ()) -> int:
        """Requeue every task ``worker_id`` holds but those in ``keep``, without waiting out
        its lease.

        The supervisor calls it as soon as it sees a worker exit; ``lost`` counts a lost lease
        (the worker died running the task), as the sweeper would. The lease stays the safety
        net when a whole machine dies and nobody is left to call this.
        """
        now = now_ms()
        async with self.db.read() as session:
            held = await reads.held_by(session, worker_id)
        changed = 0
        for task_id, losses in held:
            if task_id in keep:
                continue
            if lost:
                changed += int(await self._lose_lease(task_id, worker_id, losses, now))
            elif await self.release(task_id, worker_id):
                log.info("task %s released (worker %s stopped)", task_id, worker_id)
                changed += 1
        return changed

    async def requeue_lost(self, task_id: str, worker_id: str) -> bool:
        """Requeue a running task whose run died with a process of this worker (its model
        process), counting a lost lease, as the sweeper counts one for a dead worker."""
        async with self.db.write() as session:
            requeued = await writes.requeue_lost(
                session, task_id, worker_id, now_ms(), expired=False
            )
            if requeued:
                await wakeups.notify(session, wakeups.TASKS)
        if requeued:
            metrics.lease_lost(failed=False)
        return bool(requeued)

    async def _lose_lease(
        self, task_id: str, owner: str | None, losses: int, now: int, *, expired: bool = False
    ) -> bool:
        """Requeue a task whose worker is gone, or fail it once that happened too often."""
        if losses + 1 >= self.settings.max_lease_losses:
            message = (
                f"the worker running this task stopped responding {losses + 1} time(s); giving up"
            )
            failed = await self._finish(
                task_id,
                owner,
                dict(
                    status=TaskStatus.FAILED,
                    error_code=int(ErrorCode.WORKER_LOST),
                    error_message=message,
                    lease_losses=losses + 1,
                ),
            )
            if failed:
                metrics.lease_lost(failed=True)
            return failed
        async with self.db.write() as session:
            requeued = await writes.requeue_lost(session, task_id, owner, now, expired=expired)
            if requeued:
                await wakeups.notify(session, wakeups.TASKS)
        if requeued:
            log.warning("task %s lost its lease (worker %s); requeued", task_id, owner)
            metrics.lease_lost(failed=False)
            return True
        return False
