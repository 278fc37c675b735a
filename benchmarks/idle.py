"""The idle cost of ``genhook serve`` with two workers: CPU, memory and database writes.

    .venv/bin/python benchmarks/idle.py [--seconds 10] [--settle 5] [--skip-postgres]
                                        [--after-tasks]

Starts the service (SQLite, then PostgreSQL), waits ``--settle`` seconds for start-up work to
end, then samples the CPU time of the whole process tree (supervisor, api, workers,
dispatcher) over ``--seconds`` and prints it as a share of one core, with the tree's total
RSS and PSS, then each process's memory, CPU and wake-ups (context switches; ``serve`` is the
supervisor). It also counts database writes in the window: SQLite's ``PRAGMA data_version``
and WAL size, PostgreSQL's inserted, updated and deleted row counters. Targets: under 1% of
one core, under 250 MB, no writes. With ``--after-tasks`` it samples again after one image
edit and one text-to-speech task: idle still, but with the workers' models loaded.

Last, it prints the floor under the tree's memory: for each role, a bare Python process that
imports only the libraries the role is built on (SQLAlchemy, Pydantic, FastAPI and uvicorn,
aiohttp, ...) and none of the service, summed over the same five processes.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._harness import (  # noqa: E402
    is_service,
    postgres_database,
    role_of,
    running_service,
)
from benchmarks._proc import cpu_seconds, descendants, memory_bytes  # noqa: E402

MB = 1024 * 1024
SETTINGS = {
    "workers": "2",
    "worker_poll_seconds": "5",
    "webhook_poll_seconds": "5",
    "log_level": "WARNING",
}


class SQLiteWrites:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.connection = sqlite3.connect(path)

    def sample(self) -> tuple[int, int]:
        (version,) = self.connection.execute("PRAGMA data_version").fetchone()
        wal = self.path.with_name(self.path.name + "-wal")
        return int(version), wal.stat().st_size if wal.exists() else 0


class PostgresWrites:
    def __init__(self, server: object, database: str) -> None:
        self.server = server
        self.database = database

    def sample(self) -> tuple[int, int]:
        from tests.support.postgres import _find

        port = self.server.port  # type: ignore[attr-defined]
        out = subprocess.run(
            [
                _find("psql"),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-U",
                "postgres",
                "-d",
                self.database,
                "-At",
                "-c",
                "SELECT pg_stat_force_next_flush(); SELECT tup_inserted + tup_updated + "
                f"tup_deleted, xact_commit FROM pg_stat_database WHERE datname = '{self.database}'",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        rows, commits = out[-1].split("|")
        return int(rows), int(commits)


def measure(
    name: str, url: str | None, tmp: Path, args: argparse.Namespace, writes: object
) -> None:
    data_dir = tmp / name
    with running_service(str(data_dir), url, ready_timeout=240.0, **SETTINGS) as (base, key):
        time.sleep(args.settle)
        probe = writes if writes is not None else SQLiteWrites(data_dir / "genhook.db")
        sample(name, probe, writes is None, args)
        if args.after_tasks:
            run_tasks(base, key)
            time.sleep(args.settle)
            sample(f"{name} after an edit and a speech task", probe, writes is None, args)


def run_tasks(base: str, key: str) -> None:
    """One image edit and one text-to-speech task, each waited for: the workers that ran
    them keep their models loaded, which is what the second sample shows."""
    import httpx
    from tests.support.images import data_url

    bodies = {
        "generateImage": {
            "model": "genhook/image-edit",
            "prompt": "black and white",
            "images": [data_url()],
            "size": "1024*1024",
        },
        "generateAudio": {"model": "genhook/text-to-speech", "prompt": "Hello from genhook."},
    }
    headers = {"Authorization": f"Bearer {key}", "Prefer": "wait=60"}
    for path, body in bodies.items():
        answer = httpx.post(f"{base}/api/v1/model/{path}", json=body, headers=headers, timeout=90)
        assert answer.json()["status"] == "completed", answer.text


def sample(name: str, probe: object, sqlite: bool, args: argparse.Namespace) -> None:
    tree = [pid for pid in descendants(os.getpid()) if is_service(pid)]
    before = probe.sample()  # type: ignore[attr-defined]
    own0 = [(cpu_seconds([pid]), wakeups(pid)) for pid in tree]
    cpu0, t0 = cpu_seconds(tree), time.monotonic()
    time.sleep(args.seconds)
    cpu1, t1 = cpu_seconds(tree), time.monotonic()
    own1 = [(cpu_seconds([pid]), wakeups(pid)) for pid in tree]
    time.sleep(1.0)  # PostgreSQL publishes its counters at most once a second
    after = probe.sample()  # type: ignore[attr-defined]
    rss, pss = memory_bytes(tree)
    per_process = [
        (role_of(pid), *memory_bytes([pid]), c1 - c0, w1 - w0)
        for pid, (c0, w0), (c1, w1) in zip(tree, own0, own1, strict=True)
    ]
    share = (cpu1 - cpu0) / (t1 - t0)
    if sqlite:
        what = f"data_version {before[0]}->{after[0]}, WAL {before[1]}->{after[1]} bytes"
        wrote = after != before
    else:
        what = f"rows written {after[0] - before[0]}, commits {after[1] - before[1]}"
        wrote = after[0] != before[0]
    print(
        f"{name:<9} {len(tree)} processes: CPU {share:6.2%} of one core over {t1 - t0:.0f} s; "
        f"RSS {rss / MB:6.1f} MB (PSS {pss / MB:6.1f} MB); "
        f"writes: {'YES' if wrote else 'none'} ({what})"
    )
    for role, rss, pss, cpu, woke in per_process:
        print(
            f"    {role:<14} RSS {rss / MB:6.1f} MB  PSS {pss / MB:6.1f} MB  "
            f"CPU {cpu / (t1 - t0):6.2%}  wake-ups {woke / (t1 - t0):6.1f}/s"
        )


# What each role cannot run without, none of it the service's own code: the database layer,
# settings and models, metrics, and per role its HTTP server, client or signing keys.
_COMMON = [
    "asyncio",
    "pydantic",
    "pydantic_settings",
    "sqlalchemy.ext.asyncio",
    "aiosqlite",
    "prometheus_client",
]
_KEYS = "cryptography.hazmat.primitives.asymmetric.ed25519"
FLOOR = {
    "serve": ["asyncio", "subprocess", "logging", "json"],
    "api": [*_COMMON, "fastapi", "uvicorn", _KEYS],
    "worker": _COMMON,
    "dispatcher": [*_COMMON, "aiohttp", _KEYS],
}


def library_floor(workers: int) -> None:
    """RSS of one bare process per role that imports only the libraries the role is built
    on, summed over the tree's shape (``workers`` workers)."""
    sizes = {}
    for role, modules in FLOOR.items():
        code = f"import {', '.join(modules)}, sys; print(flush=True); sys.stdin.read()"
        process = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        try:
            assert process.stdout is not None
            process.stdout.readline()
            sizes[role] = memory_bytes([process.pid])[0]
        finally:
            process.kill()
            process.wait()
    total = sum(sizes.values()) + (workers - 1) * sizes["worker"]
    parts = ", ".join(f"{role} {size / MB:.1f}" for role, size in sizes.items())
    print(
        f"floor     the libraries alone, same {3 + workers} processes: RSS {total / MB:6.1f} MB "
        f"({parts} MB)"
    )


def wakeups(pid: int) -> int:
    """Context switches of all of ``pid``'s threads: how often the process woke up."""
    total = 0
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            text = (task / "status").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                total += int(line.split()[1])
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    # PostgreSQL backends publish their row counters up to 10 s after going idle.
    parser.add_argument("--settle", type=float, default=12.0)
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument(
        "--after-tasks",
        action="store_true",
        help="Also sample again after one image edit and one text-to-speech task.",
    )
    args = parser.parse_args()
    print(f"idle benchmark: genhook serve, 2 workers; load {os.getloadavg()[0]:.2f}")
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        measure("sqlite", None, tmp, args, None)
        if not args.skip_postgres:
            server = postgres_database(stack, "idle")
            measure("postgres", server.url("idle"), tmp, args, PostgresWrites(server, "idle"))
    library_floor(int(SETTINGS["workers"]))


if __name__ == "__main__":
    main()
