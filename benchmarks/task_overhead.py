"""The service's own CPU per task: submit, claim, completion, around an engine that does nothing.

Starts ``genhook serve`` with one worker process and the ``bench/noop`` model
(``benchmarks/noop_engine.py``, registered through ``GENHOOK_EXTRA_ENGINES``), submits
``--tasks`` tasks through the HTTP API (``--connections`` at once), waits until the worker
has completed all of them (counted in the database, so the API does no polling work), and
prints the CPU time per task of each process (the API, with the sweeper and webhook
service, and the worker) and the SQL statements each sent per task. A warm-up batch runs
first, so imports and caches are out of the figures.

    .venv/bin/python benchmarks/task_overhead.py [--tasks 1000] [--database-url ...]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy import func, select

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._harness import running_service  # noqa: E402
from benchmarks.noop_engine import PNG  # noqa: E402

from genhook.config import Settings  # noqa: E402
from genhook.db import Database, Task  # noqa: E402

BODY = {
    "model": "bench/noop",
    "prompt": "nothing",
    "images": ["data:image/png;base64," + base64.b64encode(PNG).decode()],
    "size": "1024*1024",
}
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Sample:
    cpu: dict[int, float]  # seconds of CPU by pid
    statements: dict[int, int]
    roles: dict[int, str]


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _argv(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def _role(pid: int, server: int) -> str:
    if pid == server:
        return "api"
    argv = [arg for arg in _argv(pid) if arg]
    return "worker" if argv and argv[-1].isdigit() else "feed"


def sample(server: int, sql_dir: Path) -> Sample:
    time.sleep(0.3)  # the statement counts are written every 0.1 s
    pids = [server, *_children(server)]
    statements = {}
    for pid in pids:
        path = sql_dir / f"{pid}.json"
        statements[pid] = json.loads(path.read_text())["statements"] if path.exists() else 0
    roles = {pid: _role(pid, server) for pid in pids}
    return Sample({pid: _cpu_seconds(pid) for pid in pids}, statements, roles)


async def run_batch(base: str, key: str, db: Database, count: int, connections: int) -> float:
    async with db.read() as session:
        before = await session.scalar(select(func.count()).where(Task.status == "completed"))
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(count):
        queue.put_nowait(index)
    began = time.perf_counter()
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as client:

        async def submitter() -> None:
            while not queue.empty():
                queue.get_nowait()
                response = await client.post("/api/v1/model/generateImage", json=BODY)
                response.raise_for_status()

        await asyncio.gather(*(submitter() for _ in range(connections)))
    while True:
        async with db.read() as session:
            done = await session.scalar(select(func.count()).where(Task.status == "completed"))
        if (done or 0) - (before or 0) >= count:
            return time.perf_counter() - began
        await asyncio.sleep(0.05)


def find_server() -> int:
    (server,) = [pid for pid in _children(os.getpid()) if b"genhook.cli" in _argv(pid)]
    return server


async def measure(args: argparse.Namespace, data_dir: str, sql_dir: Path) -> None:
    settings = Settings(data_dir=Path(data_dir), database_url=args.database_url)
    with running_service(
        data_dir,
        args.database_url,
        extra_engines='["benchmarks.noop_engine:register"]',
        workers="1",
    ) as (base, key):
        server = find_server()
        db = Database(settings.resolved_database_url)
        try:
            await run_batch(base, key, db, args.warmup, args.connections)
            first = sample(server, sql_dir)
            elapsed = await run_batch(base, key, db, args.tasks, args.connections)
            last = sample(server, sql_dir)
        finally:
            await db.dispose()
    print(f"{args.tasks} tasks in {elapsed:.2f} s ({args.tasks / elapsed:.0f} tasks/s)")
    total_cpu = 0.0
    for pid in sorted(last.cpu, key=lambda p: p != server):
        if pid not in first.cpu:
            continue
        role = last.roles[pid]
        cpu_ms = (last.cpu[pid] - first.cpu[pid]) / args.tasks * 1000
        sql = (last.statements[pid] - first.statements[pid]) / args.tasks
        total_cpu += cpu_ms if role != "feed" else 0.0
        print(f"  {role:6} pid {pid}: {cpu_ms:.2f} ms CPU, {sql:.2f} SQL statements per task")
    print(f"  api + worker: {total_cpu:.2f} ms CPU per task")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--database-url", default=None, help="default: SQLite in a temp dir")
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as data_dir, tempfile.TemporaryDirectory() as sql_dir:
        os.environ["GENHOOK_BENCH_SQL_DIR"] = sql_dir
        asyncio.run(measure(args, data_dir, Path(sql_dir)))
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
