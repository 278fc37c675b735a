"""What metrics cost: the per-event counter updates, and a ``/metrics`` scrape with a backlog.

Per event: the hooks a task goes through (submitted, started, finished with its run time,
one delivered attempt with its lag), timed in this process with counts held in memory and
with counts in files (``GENHOOK_METRICS_DIR``, as under ``genhook serve``).

Per scrape: ``GET /metrics`` on the api in-process (ASGI, no socket) with ``--backlog``
tasks waiting and as many deliveries pending, on SQLite and PostgreSQL, in the files mode
with ``--processes`` processes' files to add up.

    .venv/bin/python benchmarks/metrics.py [--backlog 20000] [--scrapes 20] [--skip-postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._harness import median, percentile, postgres_database  # noqa: E402

EVENTS = textwrap.dedent(
    """
    import sys, time
    from genhook import metrics
    from genhook.config import Settings
    from genhook.db import Task
    from genhook.sender.queue import Outcome, Outgoing

    settings = Settings()
    task = Task(model="genhook/image-edit", status="completed", started_at=1000,
                finished_at=1850)
    attempt = Outgoing("whd_1", "t", "a", "https://x", "x.task.terminal", b"", 0, 0, None)
    attempt.created_at = 900
    outcome = Outcome("whd_1", 0, 0, 1900, 12, 200, None, None, "kid")
    n = int(sys.argv[1])
    start = time.perf_counter()
    for _ in range(n):
        metrics.task_submitted(task.model)
        metrics.task_started(task)
        metrics.task_finished(task)
        metrics.webhook_attempted(attempt, outcome, settings)
    print((time.perf_counter() - start) / n * 1e6)
    """
)


def per_task_events(files: Path | None, n: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    if files is not None:
        files.mkdir(parents=True, exist_ok=True)
        env["GENHOOK_METRICS_DIR"] = str(files)
    out = subprocess.run(
        [sys.executable, "-c", EVENTS, str(n)], env=env, capture_output=True, text=True, check=True
    )
    return float(out.stdout)


async def scrape_times(url: str, files: Path, backlog: int, scrapes: int, processes: int) -> str:
    import httpx
    from sqlalchemy import insert

    from genhook import metrics
    from genhook.api import build_state, create_app
    from genhook.config import Settings
    from genhook.db import Account, Task, WebhookDelivery, now_ms
    from genhook.db.migrate import upgrade_in_thread

    metrics.use_directory(files, clean=True)
    for _ in range(processes):  # other processes' files, as serve's workers leave them
        code = "from genhook import metrics; metrics.task_submitted('genhook/image-edit')"
        subprocess.run([sys.executable, "-c", code], env={**os.environ}, check=True)
    settings = Settings(data_dir=files.parent / "data", database_url=url)
    upgrade_in_thread(url)
    state = build_state(settings)
    now = now_ms()
    async with state.db.write() as session:
        session.add(Account(id="acct", name="bench", signing_secret="s", created_at=now))
    rows = [
        dict(
            id=f"t{i:08d}",
            account_id="acct",
            model="genhook/image-edit",
            kind="image",
            status="created",
            params={},
            inputs=[],
            created_at=now - i,
            updated_at=now,
            available_at=now,
            deadline_at=now + 600_000,
            attempts=0,
            lease_losses=0,
            outputs=[],
            has_nsfw_contents=[],
            info={},
            charge={},
        )
        for i in range(backlog)
    ]
    deliveries = [
        dict(
            id=f"d{i:08d}",
            task_id=f"t{i:08d}",
            account_id="acct",
            url="https://x.test/",
            event_type="image.task.terminal",
            body=b"{}",
            status="pending",
            attempts=0,
            round_start=0,
            redeliveries=0,
            next_attempt_at=now + 3_600_000,
            created_at=now,
            updated_at=now,
        )
        for i in range(backlog)
    ]
    for start in range(0, backlog, 5000):
        async with state.db.write() as session:
            await session.execute(insert(Task), rows[start : start + 5000])
            await session.execute(insert(WebhookDelivery), deliveries[start : start + 5000])
    app = create_app(state)
    times = []
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://bench"
    ) as client:
        for _ in range(scrapes):
            await asyncio.sleep(1.05)  # past the one-second reuse: every scrape queries
            started = time.perf_counter()
            response = await client.get("/metrics")
            times.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200
            assert f'genhook_tasks_waiting{{model="genhook/image-edit"}} {backlog}.0' in (
                response.text
            ), response.text[-2000:]
    await state.db.dispose()
    return f"median {median(times):.1f} ms, p95 {percentile(times, 95):.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--backlog", type=int, default=20_000)
    parser.add_argument("--scrapes", type=int, default=10)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--skip-postgres", action="store_true")
    args = parser.parse_args()
    print(f"load: {os.getloadavg()[0]:.2f} (1-minute average at start)")
    with tempfile.TemporaryDirectory() as tmp_name, ExitStack() as stack:
        tmp = Path(tmp_name)
        memory = per_task_events(None, args.events)
        in_files = per_task_events(tmp / "events", args.events)
        print(
            f"hooks per task (submit, start, finish, one delivered attempt): "
            f"{memory:.2f} µs in memory, {in_files:.2f} µs in files"
        )
        backends = [("sqlite", f"sqlite+aiosqlite:///{tmp / 'bench.db'}")]
        if not args.skip_postgres:
            server = postgres_database(stack)
            backends.append(("postgres", server.url("bench")))
        for name, url in backends:
            figures = asyncio.run(
                scrape_times(
                    url, tmp / name / "metrics", args.backlog, args.scrapes, args.processes
                )
            )
            print(
                f"GET /metrics, {args.backlog} waiting + {args.backlog} pending, "
                f"{args.processes + 1} processes' files, {name}: {figures}"
            )


if __name__ == "__main__":
    main()
