"""Prometheus metrics: the task and delivery counters, and the database facts at scrape time.

Events are counted where they happen, in whichever process they happen, with one
``inc()`` or ``observe()`` each. Labels are the model and the outcome only: never task
ids, accounts or URLs, so the series stay few and no account data leaves through a scrape.
The one exception is opt-in: ``GENHOOK_METRICS_ACCOUNTS=N`` adds per-account queue gauges
for the N accounts with the most waiting tasks, by id, and the rest as ``other``.

Each process reports its own counts, unless a metrics directory is set
(``GENHOOK_METRICS_DIR``; ``genhook serve`` sets one under the data directory): then every
process of the machine writes its counts to files there (prometheus-client's multiprocess
mode) and ``render`` adds them all up. The queue and outbox gauges are facts of the
database, read by one query each when the api is scraped (``refresh_database_gauges``),
time-boxed so a slow database cannot hold a scrape or the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    values,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from genhook.files import shared_memory_dir
from genhook.statuses import DeliveryStatus, TaskStatus

if TYPE_CHECKING:
    from genhook.config import Settings
    from genhook.db import Database, Task
    from genhook.sender.queue import Outcome
    from genhook.sender.queue import Outgoing as Attempt

log = logging.getLogger(__name__)

# The environment variable prometheus-client reads; a child process inherits it.
_CLIENT_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
SETTING_DIR_VARIABLE = "GENHOOK_METRICS_DIR"

if os.environ.get(SETTING_DIR_VARIABLE) and not os.environ.get(_CLIENT_DIR_VARIABLE):
    os.environ[_CLIENT_DIR_VARIABLE] = os.environ[SETTING_DIR_VARIABLE]

# Run times from a trivial engine's milliseconds to a long video's minutes.
RUN_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BATCH_WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60)
LAG_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 7200)

TASKS_SUBMITTED = Counter(
    "genhook_tasks_submitted", "Tasks accepted by submit (replays not counted).", ["model"]
)
TASKS_STARTED = Counter(
    "genhook_tasks_started",
    "Tasks claimed by a worker (a retry after a lost lease counts again).",
    ["model"],
)
TASKS_FINISHED = Counter(
    "genhook_tasks_finished", "Tasks that reached a terminal state.", ["model", "outcome"]
)
TASK_RUN_SECONDS = Histogram(
    "genhook_task_run_seconds",
    "From a task's last claim to its terminal state, for tasks that started.",
    ["model", "outcome"],
    buckets=RUN_BUCKETS,
)
BATCH_SIZE = Histogram(
    "genhook_batch_size",
    "Tasks per engine call of a batched model (a call of one counts too).",
    ["model"],
    buckets=BATCH_SIZE_BUCKETS,
)
BATCH_WAIT_SECONDS = Histogram(
    "genhook_batch_wait_seconds",
    "From a batch's first claim to its engine call: the wait for the batch to fill.",
    ["model"],
    buckets=BATCH_WAIT_BUCKETS,
)
LEASE_LOSSES = Counter(
    "genhook_task_lease_losses",
    "Leases lost by a worker that stopped responding: requeued, or failed after too many.",
    ["outcome"],
)
WEBHOOK_ATTEMPTS = Counter(
    "genhook_webhook_attempts",
    "Webhook attempts by how they ended and their number within the delivery's retry round.",
    ["outcome", "attempt"],
)
WEBHOOK_LAG_SECONDS = Histogram(
    "genhook_webhook_terminal_to_receipt_seconds",
    "From a task's terminal state to its receiver's 2xx for the terminal event (first round).",
    buckets=LAG_BUCKETS,
)

# Every metric this module defines, for the documentation check and the switch to files.
DEFINED = (
    TASKS_SUBMITTED,
    TASKS_STARTED,
    TASKS_FINISHED,
    TASK_RUN_SECONDS,
    BATCH_SIZE,
    BATCH_WAIT_SECONDS,
    LEASE_LOSSES,
    WEBHOOK_ATTEMPTS,
    WEBHOOK_LAG_SECONDS,
)


# -- events ---------------------------------------------------------------------------------


# Labelled children by (metric name, labels): ``labels()`` takes a lock and checks its
# arguments each call, several times a task's own hooks cost.
_children: dict[tuple[str, ...], Any] = {}


def _child(metric: Any, *labels: str) -> Any:
    child = _children.get((metric._name, *labels))
    if child is None:
        child = _children[(metric._name, *labels)] = metric.labels(*labels)
    return child


def task_submitted(model: str) -> None:
    _child(TASKS_SUBMITTED, model).inc()


def task_started(task: Task) -> None:
    _child(TASKS_STARTED, task.model).inc()


def tasks_started(tasks: Iterable[Task]) -> None:
    for task in tasks:
        _child(TASKS_STARTED, task.model).inc()


def task_finished(task: Task) -> None:
    finished(task.model, task.status, task.started_at, task.finished_at)


def finished(model: str, status: str, started: int | None, ended: int | None) -> None:
    """One task ended ``status``; its run time when it had started."""
    _child(TASKS_FINISHED, model, status).inc()
    if started is not None and ended is not None:
        _child(TASK_RUN_SECONDS, model, status).observe(max(0, ended - started) / 1000)


def tasks_finished(tasks: Iterable[Task]) -> None:
    for task in tasks:
        task_finished(task)


def batch_called(model: str, size: int, waited_seconds: float) -> None:
    """One engine call of a batched model: its tasks, and how long the batch waited to fill."""
    _child(BATCH_SIZE, model).observe(size)
    _child(BATCH_WAIT_SECONDS, model).observe(max(0.0, waited_seconds))


def lease_lost(*, failed: bool) -> None:
    _child(LEASE_LOSSES, TaskStatus.FAILED if failed else "requeued").inc()


def webhook_attempted(attempt: Attempt, outcome: Outcome, settings: Settings) -> None:
    """Count one attempt as the sender saw it; ``attempt`` is its number in the round."""
    number = outcome.attempts + 1 - outcome.round_start
    if outcome.acknowledged:
        state: str = DeliveryStatus.DELIVERED
        if attempt.terminal_at is not None and outcome.round_start == 0:
            received = outcome.started_at + outcome.duration_ms
            lag = max(0, received - attempt.terminal_at) / 1000
            WEBHOOK_LAG_SECONDS.observe(lag)
    elif _gives_up(settings, outcome, number):
        state = DeliveryStatus.UNDELIVERABLE
    else:
        state = "retry"
    _child(WEBHOOK_ATTEMPTS, state, str(number)).inc()


def _gives_up(settings: Settings, outcome: Outcome, in_round: int) -> bool:
    from genhook.sender.feed import gives_up  # the feed's own rule; imported on first use

    global _gives_up
    _gives_up = gives_up
    return gives_up(settings, outcome, in_round)


# -- database facts -------------------------------------------------------------------------


class DatabaseGauges(Collector):
    """The queue and outbox as the last refresh found them; nothing before the first one.

    A refresh older than ``max_age`` is repeated at the next scrape; a failed or slow one
    reports ``genhook_metrics_database_up 0`` and leaves the facts out rather than stale.
    """

    def __init__(self) -> None:
        self.waiting: list[tuple[str, int, int]] = []  # model, count, oldest created_at
        self.outbox: tuple[int, int | None] = (0, None)
        # (account id or "other", waiting, running, weight or None, usage share); None: off.
        self.accounts: list[tuple[str, int, int, int | None, float]] | None = None
        self.up: bool | None = None
        self.refreshed_at = 0.0  # monotonic
        self.measured_at = 0  # epoch ms
        self._source: Database | None = None
        self._locks: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}

    def collect(self) -> Iterator[Metric]:
        if self.up is None:
            return
        up = GaugeMetricFamily(
            "genhook_metrics_database_up",
            "1 when the last scrape read the queue and outbox from the database in time.",
        )
        up.add_metric([], 1 if self.up else 0)
        yield up
        if not self.up:
            return
        depth = GaugeMetricFamily(
            "genhook_tasks_waiting",
            "Tasks waiting for a worker (status created).",
            labels=("model",),
        )
        oldest = GaugeMetricFamily(
            "genhook_task_oldest_waiting_seconds",
            "Age of the oldest task still waiting for a worker.",
            labels=["model"],
        )
        for model, count, created_at in self.waiting:
            depth.add_metric([model], count)
            oldest.add_metric([model], max(0, self.measured_at - created_at) / 1000)
        yield depth
        yield oldest
        pending, first = self.outbox
        outbox = GaugeMetricFamily(
            "genhook_webhook_outbox_pending", "Webhook deliveries not yet delivered or given up."
        )
        outbox.add_metric([], pending)
        yield outbox
        age = GaugeMetricFamily(
            "genhook_webhook_outbox_oldest_seconds",
            "Age of the oldest pending webhook delivery (0 when none).",
        )
        age.add_metric([], 0 if first is None else max(0, self.measured_at - first) / 1000)
        yield age
        if self.accounts is not None:
            yield from self._account_families(self.accounts)

    @staticmethod
    def _account_families(
        rows: list[tuple[str, int, int, int | None, float]],
    ) -> Iterator[Metric]:
        labels = ["account"]
        waiting = GaugeMetricFamily(
            "genhook_account_tasks_waiting",
            "Tasks waiting for a worker, per account (top GENHOOK_METRICS_ACCOUNTS, the rest "
            "as other).",
            labels=labels,
        )
        running = GaugeMetricFamily(
            "genhook_account_tasks_running", "Tasks a worker runs now, per account.", labels=labels
        )
        weight = GaugeMetricFamily(
            "genhook_account_weight", "The account's fair-queuing weight.", labels=labels
        )
        share = GaugeMetricFamily(
            "genhook_account_usage_share",
            "The account's part of the worker time used over the last 15 minutes, 0 to 1.",
            labels=labels,
        )
        for account, queued, held, account_weight, used in rows:
            waiting.add_metric([account], queued)
            running.add_metric([account], held)
            if account_weight is not None:
                weight.add_metric([account], account_weight)
            share.add_metric([account], used)
        yield from (waiting, running, weight, share)

    async def refresh(
        self, db: Database, *, timeout: float, max_age: float, accounts: int = 0
    ) -> None:
        loop = asyncio.get_running_loop()
        if loop not in self._locks:
            self._locks = {loop: asyncio.Lock()}
        async with self._locks[loop]:  # concurrent scrapes share one read
            if db is self._source and time.monotonic() - self.refreshed_at < max_age:
                return
            self._source = db
            try:
                await asyncio.wait_for(self._read(db, accounts), timeout)
                self.up = True
            except Exception as error:  # TimeoutError included: report, never fail a scrape
                log.warning("metrics: reading the queue and outbox failed (%r)", error)
                self.up = False
            self.refreshed_at = time.monotonic()

    async def _read(self, db: Database, accounts: int) -> None:
        from sqlalchemy import func, select

        from genhook.db import WebhookDelivery, now_ms
        from genhook.tasks.store.reads import waiting_by_model

        outbox = select(func.count(), func.min(WebhookDelivery.created_at)).where(
            WebhookDelivery.status == DeliveryStatus.PENDING
        )
        async with db.read() as session:
            rows = await waiting_by_model(session)
            pending = (await session.execute(outbox)).one()
        self.measured_at = now_ms()
        self.waiting = [(str(m), int(c), int(o)) for m, c, o in rows]
        self.outbox = (int(pending[0]), None if pending[1] is None else int(pending[1]))
        self.accounts = await _top_accounts(db, accounts) if accounts else None


async def _top_accounts(db: Database, n: int) -> list[tuple[str, int, int, int | None, float]]:
    """The ``n`` accounts with the most waiting tasks (``tasks/shares.py``'s order), and
    every other one added up as ``other``: at most ``n + 1`` series per gauge."""
    from genhook.tasks.shares import measure

    shares = (await measure(db)).accounts
    rows: list[tuple[str, int, int, int | None, float]] = [
        (a.account_id, a.waiting, a.running, a.weight, a.usage_share) for a in shares[:n]
    ]
    rest = shares[n:]
    if rest:
        rows.append(
            (
                "other",
                sum(a.waiting for a in rest),
                sum(a.running for a in rest),
                None,
                sum(a.usage_share for a in rest),
            )
        )
    return rows


DATABASE = DatabaseGauges()
REGISTRY.register(DATABASE)


async def refresh_database_gauges(
    db: Database, *, timeout: float = 2.0, max_age: float = 1.0, accounts: int = 0
) -> None:
    """``accounts``: how many accounts get gauges of their own (0: none)."""
    await DATABASE.refresh(db, timeout=timeout, max_age=max_age, accounts=accounts)


# -- exposition -----------------------------------------------------------------------------


def multiprocess_dir() -> Path | None:
    path = os.environ.get(_CLIENT_DIR_VARIABLE)
    return Path(path) if path else None


def render() -> tuple[bytes, str]:
    """The exposition body and its content type: this machine's processes added up when a
    metrics directory is in use, this process alone otherwise."""
    path = multiprocess_dir()
    if path is None:
        return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
    registry = CollectorRegistry(auto_describe=True)
    MultiProcessCollector(registry, path=str(path))  # type: ignore[no-untyped-call]
    registry.register(DATABASE)
    return generate_latest(registry), CONTENT_TYPE_LATEST


def serve_directory(settings: Settings) -> tuple[Path, bool]:
    """Where ``genhook serve`` and its workers count, and whether to empty it first.

    ``GENHOOK_METRICS_DIR`` is the operator's, emptied at start. Otherwise each supervisor
    gets ``<base>/<host>-<pid>``, the base in shared memory (``files.shared_memory_dir``),
    so services of one machine never add up or delete each other's counts; those of
    supervisors of this host that are gone are removed.
    """
    if settings.metrics_dir is not None:
        return settings.metrics_dir, True
    # Shared memory by default: the files are memory mapped and grow as they are written;
    # on a full disk, touching a page the disk has no room for kills the process (SIGBUS).
    shared = shared_memory_dir()
    base = settings.data_dir / "metrics" if shared is None else shared / "metrics"
    host = socket.gethostname()
    for old in base.glob(f"{host}-*") if base.is_dir() else ():
        pid = old.name.rpartition("-")[2]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return base / f"{host}-{os.getpid()}", True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def use_directory(path: Path, clean: bool) -> None:
    """Count into files under ``path`` from now on, in this process and every child started
    after (they inherit the environment). ``clean`` empties it first: counts of a previous
    run must not be added to this one's. Call before anything is counted."""
    if clean and path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.environ[_CLIENT_DIR_VARIABLE] = str(path)
    values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]
    # prometheus-client picks a value's storage when the value is made: labelled children
    # made so far (none, before anything is counted) are dropped, unlabelled values remade.
    _children.clear()
    for metric in DEFINED:
        if metric._labelnames:
            with metric._lock:
                metric._metrics = {}
        else:
            metric._metric_init()


def metric_names() -> list[str]:
    """Every metric name a scrape may show, as documented in docs/operations.md."""
    names = [metric._name + ("_total" if metric._type == "counter" else "") for metric in DEFINED]
    families = DatabaseGauges()
    families.up = True
    families.accounts = []
    names += [family.name for family in families.collect()]
    return names
