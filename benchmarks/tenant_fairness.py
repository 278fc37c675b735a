"""Tenant fairness benchmark: one account floods the queue, others trickle; fair against FIFO.

    .venv/bin/python benchmarks/tenant_fairness.py [--flood 150] [--run-ms 20] [--workers 1]
        [--postgres]

Each mode (``GENHOOK_SCHEDULING=fifo``, then ``fair``) runs on a fresh database with the
service's own submit path (``GroupInserter``: tags given in the insert's transaction), its
claims and completions (``Lifecycle``, the worker's statements); the engine is a sleep of
the task's run time, so the figures are the queue's, not a model's.

- **Flood:** account A submits ``--flood`` tasks at once; B and C each submit one task
  every ``--trickle-every`` run times (20) while A's backlog lasts. Printed: B's and C's
  wait (claim minus submit) p50/p99, and A's makespan (its last completion minus the
  flood's submit), per mode, with the worker time B's and C's tasks took (fair order runs
  them inside A's makespan, FIFO after it).
- **Weighted:** A (weight 3) and B (weight 1) both flood; B's tasks run twice as long as
  A's. Printed: each account's share of the worker time over the first half of the tasks,
  while both are backlogged (target: 75%/25%).

A warm-up runs a few tasks of each model first, so submit has recent run times to estimate
costs from, as a running service has.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _harness import percentile, postgres_database
from sqlalchemy import select

from genhook.config import Settings
from genhook.db import Account, Task, now_ms
from genhook.db.migrate import upgrade_in_thread
from genhook.runtime.services import Services, open_services
from genhook.statuses import TaskStatus
from genhook.tasks import Lifecycle
from genhook.tasks.admission import set_account_limits
from genhook.tasks.fairness import DEFAULT_TTL_SECONDS
from genhook.tasks.submission import GroupInserter

FAST, SLOW = "bench/fast", "bench/slow"


def new_task(task_id: str, account: str, model: str) -> Task:
    now = now_ms()
    return Task(
        id=task_id,
        account_id=account,
        model=model,
        kind="image",
        status=TaskStatus.CREATED,
        params={},
        inputs=[],
        created_at=now,
        updated_at=now,
        available_at=now,
        deadline_at=now + 3_600_000,
        attempts=0,
        lease_losses=0,
        outputs=[],
        has_nsfw_contents=[],
        info={},
        charge={},
    )


class Bench:
    def __init__(self, services: Services, run_ms: dict[str, int]) -> None:
        self.services = services
        self.inserter = GroupInserter(services.db)
        self.lifecycle = Lifecycle(services.settings, services.db, services.storage)
        self.run_ms = run_ms
        self.count = 0

    async def accounts(self, names: list[str], weights: dict[str, int] | None = None) -> None:
        async with self.services.db.write() as session:
            for name in names:
                session.add(Account(id=name, name=name, signing_secret="x", created_at=now_ms()))
        for name, weight in (weights or {}).items():
            await set_account_limits(
                self.services.db, name, per_second=None, burst=None, in_flight=None, weight=weight
            )

    async def submit(self, account: str, model: str, count: int = 1) -> None:
        tasks = []
        for _ in range(count):
            self.count += 1
            tasks.append(new_task(f"{account}-{self.count:06d}", account, model))
        await asyncio.gather(*(self.inserter.insert(task, []) for task in tasks))

    async def worker(self, name: str, stop: asyncio.Event, budget: list[int]) -> None:
        """Claims one task at a time, holds it its model's run time, completes it."""
        while not stop.is_set() and budget[0] != 0:
            claim = await self.lifecycle.claim(name, [FAST, SLOW], look_on=False)
            if not claim.tasks:
                await asyncio.sleep(0.002)
                continue
            (task,) = claim.tasks
            budget[0] -= 1
            await asyncio.sleep(self.run_ms[task.model] / 1000)
            await self.lifecycle.complete(task.id, name, outputs=[], nsfw=[], info={})

    async def run_workers(self, workers: int, until: Any, budget: int = -1) -> None:
        stop = asyncio.Event()
        left = [budget]
        running = [asyncio.create_task(self.worker(f"w{i}", stop, left)) for i in range(workers)]
        try:
            await until(left)
        finally:
            stop.set()
            await asyncio.gather(*running)

    async def warm_up(self, workers: int) -> None:
        await self.accounts(["warm"])
        await self.submit("warm", FAST, 3)
        await self.submit("warm", SLOW, 3)
        await self.run_workers(workers, self.drained)
        await asyncio.sleep(DEFAULT_TTL_SECONDS)  # the defaults read at its submits expire

    async def drained(self, _: list[int]) -> None:
        while await self.lifecycle.any_runnable([FAST, SLOW]) or await self.running():
            await asyncio.sleep(0.01)

    async def running(self) -> bool:
        async with self.services.db.read() as session:
            found = await session.scalar(
                select(Task.id).where(Task.status == TaskStatus.PROCESSING).limit(1)
            )
            return found is not None

    async def rows(self) -> list[Any]:
        async with self.services.db.read() as session:
            result = await session.execute(
                select(
                    Task.account_id,
                    Task.model,
                    Task.created_at,
                    Task.started_at,
                    Task.finished_at,
                ).where(Task.account_id != "warm")
            )
            return list(result)


async def open_bench(url: str, data_dir: Path, scheduling: str, run_ms: dict[str, int]) -> Bench:
    settings = Settings(
        data_dir=data_dir, database_url=url, scheduling=scheduling, lease_seconds=60.0
    )
    upgrade_in_thread(settings.resolved_database_url)
    return Bench(open_services(settings, claims=True), run_ms)


async def flood(url: str, data_dir: Path, scheduling: str, args: argparse.Namespace) -> dict:
    bench = await open_bench(url, data_dir, scheduling, {FAST: args.run_ms, SLOW: args.run_ms})
    try:
        await bench.warm_up(args.workers)
        await bench.accounts(["A", "B", "C"])
        start = now_ms()
        await bench.submit("A", FAST, args.flood)
        backlog_s = args.flood * args.run_ms / 1000 / args.workers

        async def trickle(account: str, offset: float) -> None:
            await asyncio.sleep(offset)
            period = args.trickle_every * args.run_ms / 1000
            while time.monotonic() - began < backlog_s * 0.9:
                await bench.submit(account, FAST)
                await asyncio.sleep(period)

        began = time.monotonic()
        trickles = [
            asyncio.create_task(trickle("B", 0.0)),
            asyncio.create_task(trickle("C", args.trickle_every * args.run_ms / 2000)),
        ]

        async def done(_: list[int]) -> None:
            await asyncio.gather(*trickles)
            await bench.drained(_)

        await bench.run_workers(args.workers, done)
        rows = await bench.rows()
    finally:
        await bench.services.db.dispose()
    waits: dict[str, list[float]] = {"A": [], "B": [], "C": []}
    for account, _, created, started, _finished in rows:
        waits[account].append(started - created)
    makespan = max(finished for account, _, _, _, finished in rows if account == "A") - start
    others = sum(finished - started for account, _, _, started, finished in rows if account != "A")
    return {"waits": waits, "makespan": makespan, "others": others}


async def weighted(url: str, data_dir: Path, args: argparse.Namespace) -> dict[str, float]:
    bench = await open_bench(url, data_dir, "fair", {FAST: args.run_ms, SLOW: 2 * args.run_ms})
    try:
        await bench.warm_up(args.workers)
        await bench.accounts(["A", "B"], {"A": 3})
        count = args.flood
        await bench.submit("A", FAST, count)
        await bench.submit("B", SLOW, count)

        async def half(left: list[int]) -> None:
            while left[0] > 0 or await bench.running():
                await asyncio.sleep(0.01)

        await bench.run_workers(args.workers, half, budget=count)
        rows = await bench.rows()
    finally:
        await bench.services.db.dispose()
    used = {"A": 0.0, "B": 0.0}
    for account, _model, _created, started, finished in rows:
        if started is not None and finished is not None:
            used[account] += finished - started
    total = sum(used.values()) or 1.0
    return {account: 100 * value / total for account, value in used.items()}


async def main(args: argparse.Namespace) -> None:
    print(f"load: {Path('/proc/loadavg').read_text().strip()}")
    with contextlib.ExitStack() as stack:
        server = postgres_database(stack) if args.postgres else None
        results: dict[str, dict] = {}
        for index, mode in enumerate(("fifo", "fair", "weighted")):
            data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            if server is not None:
                name = f"bench_{index}"
                server.psql(f"CREATE DATABASE {name}")
                url = server.url(name)
            else:
                url = f"sqlite+aiosqlite:///{data_dir / 'genhook.db'}"
            if mode == "weighted":
                share = await weighted(url, data_dir, args)
            else:
                results[mode] = await flood(url, data_dir, mode, args)
        backend = "PostgreSQL" if server is not None else "SQLite"
        print(
            f"{backend}, {args.workers} worker(s), A floods {args.flood} tasks of "
            f"{args.run_ms} ms; B and C submit one every {args.trickle_every * args.run_ms} ms"
        )
        for mode, result in results.items():
            waits = result["waits"]
            line = [f"{mode:5}"]
            for account in ("B", "C"):
                values = waits[account]
                line.append(
                    f"{account} wait p50 {percentile(values, 50):7.0f} ms "
                    f"p99 {percentile(values, 99):7.0f} ms (n={len(values)})"
                )
            line.append(f"A makespan {result['makespan'] / 1000:6.2f} s")
            line.append(f"B+C worker time {result['others'] / 1000:5.2f} s")
            print(" | ".join(line))
        ratio = results["fair"]["makespan"] / results["fifo"]["makespan"]
        print(f"A's makespan fair/fifo: {ratio:.3f}")
        print(
            f"weighted 3:1 (B's tasks twice as long): worker time A {share['A']:.1f}% "
            f"B {share['B']:.1f}% over the first {args.flood} tasks"
        )
    print(f"load: {Path('/proc/loadavg').read_text().strip()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flood", type=int, default=150)
    parser.add_argument("--run-ms", type=int, default=20)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--trickle-every", type=int, default=20, help="in run times")
    parser.add_argument("--postgres", action="store_true")
    os.environ.setdefault("GENHOOK_LOG_LEVEL", "WARNING")
    asyncio.run(main(parser.parse_args()))
