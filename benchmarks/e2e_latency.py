"""End-to-end latency of ``genhook serve``: submit to signed webhook receipt, open loop.

    .venv/bin/python benchmarks/e2e_latency.py [--rates 10,60,120] [--seconds 10]
        [--workers 2] [--skip-sqlite] [--skip-postgres]

The service runs with two workers and the trivial engine (``benchmarks/trivial_engine.py``:
decode an ~8 KB PNG, grayscale, resize to 1024x1024, JPEG), with the default safety-net
polls, so every hand-over is a wake-up. Tasks are submitted at a fixed rate from scheduled
send times (open loop: a slow answer does not delay the next submit), each with a
``webhook_url`` on a loopback aiohttp receiver; latency runs from the scheduled send time to
the webhook's receipt. For each rate it prints p50/p90/p99/max, the submits refused, the
webhooks that never came, and the service's CPU per task: the process tree's CPU time per
task, less the engine's own CPU time (``info.engine_ms``), and per process; and the median
time each hand-over took (``stages``: from the database's timestamps and the client's
clock). SQLite, then PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import random
import sys
import tempfile
import time
from contextlib import ExitStack
from itertools import pairwise
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._harness import (  # noqa: E402
    is_service,
    percentile,
    postgres_database,
    role_of,
    running_service,
)
from benchmarks._proc import cpu_seconds, descendants  # noqa: E402

from genhook.config import Settings  # noqa: E402

DRAIN_SECONDS = 30.0


def png_data_url(size: int = 52) -> str:
    """An ~8 KB PNG: noise does not compress."""
    rng = random.Random(7)
    image = Image.frombytes("RGB", (size, size), bytes(rng.randrange(256) for _ in range(size**3)))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


class Hooks:
    """The webhook receiver: when each task's callback arrived, and its engine time."""

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        # The same instant on the wall clock (epoch ms), to set beside the database's times.
        self.arrived_at: dict[str, float] = {}
        self.engine_ms: dict[str, float] = {}
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        now = time.monotonic()
        data = json.loads(body)
        task_id = data["session_id"]
        self.arrived.setdefault(task_id, now)
        self.arrived_at.setdefault(task_id, time.time() * 1000)
        info = data.get("payload", {}).get("info") or {}
        if "engine_ms" in info:
            self.engine_ms[task_id] = float(info["engine_ms"])
        return web.Response(status=200)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}/hook"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def run_rate(
    base: str,
    key: str,
    hooks: Hooks,
    image: str,
    rate: float,
    seconds: float,
    server_pids: list[int] | None = None,
) -> dict[str, Any]:
    sent: dict[str, float] = {}
    sent_at: dict[str, float] = {}  # the scheduled send on the wall clock (epoch ms)
    refused = 0
    errors = 0
    body = {
        "model": "bench/trivial",
        "prompt": "grayscale",
        "images": [image],
        "size": "1024*1024",
        "webhook_url": hooks.url,
    }
    payload = json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=0)
    tree = [pid for pid in descendants(os.getpid()) if is_service(pid)]
    database = server_pids or []
    async with aiohttp.ClientSession(connector=connector) as client:

        async def submit(scheduled: float) -> None:
            nonlocal refused, errors
            try:
                async with client.post(
                    base + "/api/v1/model/generateImage", data=payload, headers=headers
                ) as response:
                    answer = await response.read()
                    if response.status == 200:
                        task_id = json.loads(answer)["id"]
                        sent[task_id] = scheduled
                        sent_at[task_id] = (scheduled - begin) * 1000 + wall_begin
                    else:
                        refused += 1
            except aiohttp.ClientError:
                errors += 1

        total = int(rate * seconds)
        cpu0 = cpu_seconds(tree)
        own0 = {pid: cpu_seconds([pid]) for pid in tree}
        db0 = cpu_seconds(database)
        begin = time.monotonic()
        wall_begin = time.time() * 1000
        pending = []
        for i in range(total):
            scheduled = begin + i / rate
            delay = scheduled - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            pending.append(asyncio.create_task(submit(scheduled)))
        await asyncio.gather(*pending)
        deadline = time.monotonic() + DRAIN_SECONDS
        while time.monotonic() < deadline and any(t not in hooks.arrived for t in sent):
            await asyncio.sleep(0.05)
        cpu = cpu_seconds(tree) - cpu0
        own = {pid: cpu_seconds([pid]) - own0[pid] for pid in tree}
        db_cpu = cpu_seconds(database) - db0
    latencies = sorted((hooks.arrived[t] - s) * 1000 for t, s in sent.items() if t in hooks.arrived)
    done = [t for t in sent if t in hooks.arrived]
    engine = sum(hooks.engine_ms.get(t, 0.0) for t in done) / max(1, len(done))
    per_task = cpu * 1000 / max(1, len(done))
    return {
        "rate": rate,
        "tasks": len(sent),
        "refused": refused,
        "errors": errors,
        "lost": len(sent) - len(done),
        "p50": percentile(latencies, 50),
        "p90": percentile(latencies, 90),
        "p99": percentile(latencies, 99),
        "max": latencies[-1] if latencies else float("nan"),
        "cpu_ms": per_task,
        "engine_ms": engine,
        "service_ms": per_task - engine,
        "per_role": {role_of(pid): ms * 1000 / max(1, len(done)) for pid, ms in own.items()},
        "database_ms": db_cpu * 1000 / max(1, len(done)),
        "sent_at": {t: sent_at[t] for t in done},
    }


STAGES = ("created", "claimed", "completed", "attempt", "received")


async def stages(
    database_url: str, sent_at: dict[str, float], received_at: dict[str, float]
) -> tuple[dict[str, float], dict[str, float]]:
    """Median milliseconds of each hand-over, over every task and over the slowest 5%:
    the scheduled send to the task row's ``created_at`` (HTTP, validation, insert), to the
    claim (``started_at``), to the completion (``finished_at``: input, engine, output,
    completion), to the first webhook attempt's start (commit, dispatcher's wake-up, claim,
    signing), to the receipt. The database keeps whole milliseconds, so each is good to
    about 1 ms."""
    from sqlalchemy import func, select

    from genhook.db import Database, Task, WebhookAttempt, WebhookDelivery

    db = Database(database_url)
    try:
        async with db.read() as session:
            ids = list(sent_at)
            tasks = await session.execute(
                select(Task.id, Task.created_at, Task.started_at, Task.finished_at).where(
                    Task.id.in_(ids)
                )
            )
            attempts = await session.execute(
                select(WebhookDelivery.task_id, func.min(WebhookAttempt.started_at))
                .join(WebhookAttempt, WebhookAttempt.delivery_id == WebhookDelivery.id)
                .where(WebhookDelivery.task_id.in_(ids))
                .group_by(WebhookDelivery.task_id)
            )
            first_attempt = {task_id: started for task_id, started in attempts}
            per_task: list[tuple[float, list[float]]] = []  # (total, each step)
            for task_id, created, started, finished in tasks:
                attempt = first_attempt.get(task_id)
                if started is None or finished is None or attempt is None:
                    continue
                times = [sent_at[task_id], created, started, finished, attempt]
                times.append(received_at[task_id])
                steps = [after - before for before, after in pairwise(times)]
                per_task.append((times[-1] - times[0], steps))
    finally:
        await db.dispose()
    per_task.sort(key=lambda entry: entry[0])
    slowest = per_task[-max(1, len(per_task) // 20) :]

    def medians(entries: list[tuple[float, list[float]]]) -> dict[str, float]:
        return {
            stage: percentile(sorted(steps[i] for _, steps in entries), 50)
            for i, stage in enumerate(STAGES)
        }

    return medians(per_task), medians(slowest)


def postgres_pids(server: Any) -> list[int]:
    """The PostgreSQL server's processes (postmaster and backends): CPU the service costs
    the machine that the service's own processes do not show."""
    postmaster = int((server.datadir / "postmaster.pid").read_text().split()[0])
    return [postmaster, *descendants(postmaster)]


async def measure(
    name: str,
    url: str | None,
    data_dir: Path,
    rates: list[float],
    args: argparse.Namespace,
    server: Any = None,
) -> None:
    hooks = Hooks()
    await hooks.start()
    image = png_data_url()
    settings = {
        "workers": str(args.workers),
        "extra_engines": '["benchmarks.trivial_engine:register"]',
        "webhook_allow_private_targets": "true",
        # The service's defaults: wake-ups, with the slow safety-net polls.
        "worker_poll_seconds": "5",
        "webhook_poll_seconds": "5",
        "log_level": "WARNING",
    }
    try:
        with running_service(str(data_dir), url, **settings) as (base, key):
            await asyncio.sleep(3)  # workers and the webhook feed start
            await run_rate(base, key, hooks, image, 5, 2)  # warm-up
            for rate in rates:
                await asyncio.sleep(2)
                pids = postgres_pids(server) if server is not None else None
                r = await run_rate(base, key, hooks, image, rate, args.seconds, pids)
                print(
                    f"{name:<9} {rate:5.0f}/s  {r['tasks']:5d} tasks  p50 {r['p50']:7.1f} ms  "
                    f"p90 {r['p90']:7.1f}  p99 {r['p99']:7.1f}  max {r['max']:7.1f}  "
                    f"refused {r['refused']}  errors {r['errors']}  no webhook {r['lost']}  "
                    f"CPU/task {r['cpu_ms']:.1f} ms (engine {r['engine_ms']:.1f}, "
                    f"service {r['service_ms']:.1f}); load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
                roles = "  ".join(f"{role} {ms:.2f}" for role, ms in sorted(r["per_role"].items()))
                database = f"  PostgreSQL server {r['database_ms']:.2f}" if pids else ""
                print(f"{'':<9} ms of CPU per task: {roles}{database}", flush=True)
                served = Settings(data_dir=data_dir, database_url=url).resolved_database_url
                every, slowest = await stages(served, r["sent_at"], hooks.arrived_at)
                for label, medians in (("medians", every), ("the slowest 5%", slowest)):
                    steps = "  ".join(f"{stage} {ms:.1f}" for stage, ms in medians.items())
                    print(f"{'':<9} ms to each step from the one before ({label}): send -> {steps}")
    finally:
        await hooks.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="10,60,120")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--skip-sqlite", action="store_true")
    parser.add_argument("--skip-postgres", action="store_true")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    print(
        f"end-to-end latency: submit to webhook receipt, {args.workers} workers, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        if not args.skip_sqlite:
            asyncio.run(measure("sqlite", None, tmp / "sqlite", rates, args))
        if not args.skip_postgres:
            server = postgres_database(stack, "e2e")
            asyncio.run(
                measure("postgres", server.url("e2e"), tmp / "postgres", rates, args, server)
            )


if __name__ == "__main__":
    main()
