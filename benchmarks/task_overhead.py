"""The service's own CPU per task: submit, claim, completion, around an engine that does nothing.

The ``bench/noop`` model (``benchmarks/noop_engine.py``, registered through
``GENHOOK_EXTRA_ENGINES``) returns a constant 1×1 PNG, so what a task costs is the service's
own work. Two phases, so neither process is measured while it waits for the other:

1. The API: ``genhook serve`` with no worker; ``--tasks`` submits through the HTTP API
   (``--connections`` at once), after ``--warmup`` submits. CPU time of the api process (the
   supervisor's child that answers HTTP) and its SQL statements, per submit.
2. The worker: a ``genhook worker`` process started on the backlog; its CPU time, SQL
   statements and transactions from the moment ``--warmup`` tasks are completed to the last
   completion, per task completed in between (counted in the database, so no process polls
   for it).

    .venv/bin/python benchmarks/task_overhead.py [--tasks 1000] [--postgres | --database-url ...]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from sqlalchemy import func, select

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._harness import (  # noqa: E402
    api_process,
    argv,
    child_pythonpath,
    children,
    postgres_database,
    running_service,
    stop_process,
)
from benchmarks.noop_engine import PNG, read_counts  # noqa: E402

from genhook.config import Settings  # noqa: E402
from genhook.db import Database, Task  # noqa: E402

BODY = {
    "model": "bench/noop",
    "prompt": "nothing",
    "images": ["data:image/png;base64," + base64.b64encode(PNG).decode()],
    "size": "1024*1024",
}
ENGINES = '["benchmarks.noop_engine:register"]'
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def statements(sql_dir: Path, pid: int, what: str = "statements") -> int:
    """SQL statements (or, ``what="tx"``, transactions begun) a process has sent."""
    count, transactions = read_counts(sql_dir, pid)
    return transactions if what == "tx" else count


async def completed(db: Database) -> int:
    async with db.read() as session:
        return int(await session.scalar(select(func.count()).where(Task.status == "completed")))


async def submit(base: str, key: str, count: int, connections: int) -> None:
    left = [count]
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as client:

        async def submitter() -> None:
            while left[0] > 0:
                left[0] -= 1
                response = await client.post("/api/v1/model/generateImage", json=BODY)
                response.raise_for_status()

        await asyncio.gather(*(submitter() for _ in range(connections)))


async def api_phase(args: argparse.Namespace, data_dir: str, sql_dir: Path) -> None:
    with running_service(data_dir, args.database_url, extra_engines=ENGINES, workers="0") as (
        base,
        key,
    ):
        (supervisor,) = [
            pid
            for pid in children(os.getpid())
            if {b"genhook.cli", b"genhook.runtime.supervisor"} & set(argv(pid))
        ]
        server = api_process(supervisor)  # the supervisor only supervises
        await submit(base, key, args.warmup, args.connections)
        time.sleep(0.2)  # the statement count is written every 20 ms
        cpu, sql = cpu_seconds(server), statements(sql_dir, server)
        began = time.perf_counter()
        await submit(base, key, args.tasks, args.connections)
        elapsed = time.perf_counter() - began
        time.sleep(0.2)
        cpu, sql = cpu_seconds(server) - cpu, statements(sql_dir, server) - sql
    print(
        f"api: {args.tasks} submits in {elapsed:.2f} s ({args.tasks / elapsed:.0f}/s): "
        f"{cpu / args.tasks * 1000:.2f} ms CPU, {sql / args.tasks:.2f} SQL statements per task"
    )


async def worker_phase(args: argparse.Namespace, data_dir: str, sql_dir: Path) -> None:
    settings = Settings(data_dir=Path(data_dir), database_url=args.database_url)
    env = {
        **os.environ,
        "GENHOOK_DATA_DIR": data_dir,
        "GENHOOK_EXTRA_ENGINES": ENGINES,
        "GENHOOK_LOG_LEVEL": "WARNING",
        "PYTHONPATH": child_pythonpath(),
    }
    if args.database_url:
        env["GENHOOK_DATABASE_URL"] = args.database_url
    total = args.warmup + args.tasks  # every submit of the API phase
    db = Database(settings.resolved_database_url)
    worker = subprocess.Popen(
        [sys.executable, "-m", "genhook.cli", "worker"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while (first := await completed(db)) < args.warmup:
            await _wait_on(worker)
        cpu, sql = cpu_seconds(worker.pid), statements(sql_dir, worker.pid)
        txs = statements(sql_dir, worker.pid, "tx")
        began = time.perf_counter()
        while (last := await completed(db)) < total:
            await _wait_on(worker)
        elapsed = time.perf_counter() - began
        cpu, sql = cpu_seconds(worker.pid) - cpu, statements(sql_dir, worker.pid) - sql
        txs = statements(sql_dir, worker.pid, "tx") - txs
    finally:
        stop_process(worker)
        await db.dispose()
    tasks = last - first
    print(
        f"worker: {tasks} tasks in {elapsed:.2f} s ({tasks / elapsed:.0f}/s): "
        f"{cpu / tasks * 1000:.2f} ms CPU, {sql / tasks:.2f} SQL statements, "
        f"{txs / tasks:.2f} transactions per task"
    )


async def _wait_on(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is not None:
        raise RuntimeError(f"the worker exited with status {worker.returncode}")
    await asyncio.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--database-url", default=None, help="default: SQLite in a temp dir")
    parser.add_argument(
        "--postgres", action="store_true", help="start a PostgreSQL server in a temp dir"
    )
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()}")
    with contextlib.ExitStack() as stack:
        if args.postgres:
            server = postgres_database(stack)
            args.database_url = server.url("bench")
        data_dir = stack.enter_context(tempfile.TemporaryDirectory())
        sql_dir = stack.enter_context(tempfile.TemporaryDirectory())
        os.environ["GENHOOK_BENCH_SQL_DIR"] = sql_dir
        asyncio.run(api_phase(args, data_dir, Path(sql_dir)))
        asyncio.run(worker_phase(args, data_dir, Path(sql_dir)))
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
