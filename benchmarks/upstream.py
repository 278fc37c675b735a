"""Benchmark of the upstream engine against an OpenAI-style image server on loopback.

The model server runs in its own process (aiohttp, one event loop), answers every
``/v1/images/edits`` after ``--delay-ms`` with a small base64 PNG, and reports the NSFW
flags, so genhook's detector stays out of the figures. Two measurements:

1. Overhead per task: ``--latency-tasks`` tasks run one at a time by a worker (claim, input
   from the database, upstream call, output stored, completion with usage line and outbox),
   against the same number of direct calls to the server, with no upstream delay.
2. Throughput: ``--tasks`` tasks submitted first, then one worker (this process) runs them
   with the model's concurrency at ``--concurrency``, against an upstream taking
   ``--delay-ms`` per call; tasks/s from the first claim to the last completion.

    .venv/bin/python benchmarks/upstream.py
    .venv/bin/python benchmarks/upstream.py --tasks 3000 --concurrency 64 --database-url ...
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from sqlalchemy import func, select

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._harness import free_port, percentile  # noqa: E402
from benchmarks._statements import StatementCounter  # noqa: E402

from genhook.accounts import create_account  # noqa: E402
from genhook.api import build_state  # noqa: E402
from genhook.config import Settings  # noqa: E402
from genhook.db import Task  # noqa: E402
from genhook.db.migrate import upgrade_in_thread  # noqa: E402
from genhook.tasks import Worker  # noqa: E402

# A 1x1 PNG: the point is the service's overhead, not moving bytes.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)
PNG_B64 = base64.b64encode(PNG).decode()


def serve(port: int, delay: float) -> None:
    """The model server: one process, one loop, as a GPU server's HTTP front would be."""

    async def edits(request: web.Request) -> web.Response:
        await request.read()
        if delay:
            await asyncio.sleep(delay)
        return web.json_response({"created": 1, "data": [{"b64_json": PNG_B64}], "nsfw": [False]})

    app = web.Application()
    app.router.add_post("/v1/images/edits", edits)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=1024)


class Upstream:
    def __init__(self, delay_ms: float) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(self.port), "--delay-ms", str(delay_ms)],
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def wait(self) -> None:
        async with aiohttp.ClientSession() as session:
            for _ in range(200):
                try:
                    async with session.post(self.base_url + "/v1/images/edits", data=b"x"):
                        return
                except aiohttp.ClientError:
                    await asyncio.sleep(0.05)
        raise RuntimeError("the upstream did not start")

    def cpu_seconds(self) -> float:
        """CPU time of the model server so far (it competes with the worker for the cores)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def settings_for(data_dir: Path, database_url: str | None, base_url: str, conc: int) -> Settings:
    model: dict[str, Any] = {
        "id": "bench/upstream",
        "adapter": "openai-images",
        "base_url": base_url,
        "nsfw_pointer": "/nsfw",
        "concurrency": conc,
        "deadline_seconds": 600,
    }
    return Settings(
        data_dir=data_dir,
        database_url=database_url,
        upstream_models=[model],
        webhook_allow_private_targets=True,
        worker_poll_seconds=0.01,
        lease_seconds=60,
    )


async def submit_all(settings: Settings, count: int) -> tuple[Any, list[str], str]:
    upgrade_in_thread(settings.resolved_database_url)
    state = build_state(settings)
    account = await create_account(state.db, "bench")
    image = "data:image/png;base64," + PNG_B64
    body = {"model": "bench/upstream", "prompt": "edit", "images": [image], "size": "1024*1024"}
    ids: list[str] = []
    for start in range(0, count, 256):
        tasks = await asyncio.gather(
            *(
                state.submitter.submit(account.account_id, "generateImage", dict(body))
                for _ in range(min(256, count - start))
            )
        )
        ids.extend(task.id for task in tasks)
    return state, ids, account.account_id


def make_worker(state: Any) -> Worker:
    return Worker.sharing(state, worker_id="bench")


async def latency(args: argparse.Namespace) -> dict[str, float]:
    upstream = Upstream(0)
    try:
        await upstream.wait()
        direct: list[float] = []
        async with aiohttp.ClientSession() as session:
            for _ in range(args.latency_tasks):
                form = aiohttp.FormData()
                form.add_field("prompt", "edit")
                form.add_field("image", PNG, filename="i.png", content_type="image/png")
                began = time.perf_counter()
                async with session.post(upstream.base_url + "/v1/images/edits", data=form) as r:
                    data = await r.json()
                    base64.b64decode(data["data"][0]["b64_json"])
                direct.append(time.perf_counter() - began)
        with tempfile.TemporaryDirectory() as tmp:
            settings = settings_for(Path(tmp), args.database_url, upstream.base_url, 1)
            state, ids, _ = await submit_all(settings, args.latency_tasks)
            worker = make_worker(state)
            through: list[float] = []
            for _ in ids:
                began = time.perf_counter()
                assert await worker.run_turn()
                through.append(time.perf_counter() - began)
            await worker.close_engines()
            await state.db.dispose()
    finally:
        upstream.stop()
    return {
        "direct_median_ms": statistics.median(direct) * 1000,
        "genhook_median_ms": statistics.median(through) * 1000,
        "genhook_p95_ms": percentile(through, 95) * 1000,
        "overhead_median_ms": (statistics.median(through) - statistics.median(direct)) * 1000,
    }


async def throughput(args: argparse.Namespace) -> dict[str, Any]:
    upstream = Upstream(args.delay_ms)
    try:
        await upstream.wait()
        with tempfile.TemporaryDirectory() as tmp:
            settings = settings_for(
                Path(tmp), args.database_url, upstream.base_url, args.concurrency
            )
            state, ids, account_id = await submit_all(settings, args.tasks)
            worker = make_worker(state)
            stop = asyncio.Event()
            counter = StatementCounter(state.db)
            upstream_cpu = upstream.cpu_seconds()
            began, cpu = time.perf_counter(), time.process_time()
            runner = asyncio.create_task(worker.run(stop))
            done = 0
            while done < len(ids):
                await asyncio.sleep(0.1)
                with counter.paused():  # the benchmark's own progress query
                    async with state.db.read() as session:
                        query = select(func.count()).where(
                            Task.account_id == account_id, Task.status == "completed"
                        )
                        done = await session.scalar(query) or 0
            elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
            upstream_cpu = upstream.cpu_seconds() - upstream_cpu
            counter.close()
            statements = counter.summary(len(ids))
            stop.set()
            await runner
            await state.db.dispose()
    finally:
        upstream.stop()
    return {
        "statements": statements,
        "tasks": len(ids),
        "seconds": elapsed,
        "tasks_per_second": len(ids) / elapsed,
        "worker_cpu_ms_per_task": cpu / len(ids) * 1000,
        "upstream_cpu_ms_per_task": upstream_cpu / len(ids) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--delay-ms", type=float, default=200.0)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency-tasks", type=int, default=100)
    parser.add_argument("--database-url", default=None, help="default: SQLite in a temp dir")
    parser.add_argument(
        "--loop",
        choices=["uvloop", "asyncio"],
        default="asyncio",
        help="Event loop of the worker; genhook's worker processes run on asyncio's own.",
    )
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.delay_ms / 1000)
        return
    if args.loop == "uvloop":
        import uvloop

        uvloop.install()
    print(f"load before: {os.getloadavg()}")
    if args.latency_tasks:
        overhead = asyncio.run(latency(args))
        print("overhead per task (no upstream delay, one at a time):")
        for key, value in overhead.items():
            print(f"  {key}: {value:.2f}")
    result = asyncio.run(throughput(args))
    print(
        f"throughput, one worker process, concurrency {args.concurrency}, "
        f"upstream {args.delay_ms:g} ms per call:"
    )
    print(
        f"  {result['tasks']:.0f} tasks in {result['seconds']:.2f} s: "
        f"{result['tasks_per_second']:.1f} tasks/s, "
        f"{result['worker_cpu_ms_per_task']:.2f} ms of worker CPU per task"
    )
    print(f"  {result['statements']}")
    print(f"  the model server's own CPU: {result['upstream_cpu_ms_per_task']:.2f} ms per task")
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
