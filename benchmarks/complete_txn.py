"""CPU of the worker's two transactions per task: the claim and the completion.

Creates a migrated database, inserts ``--tasks`` tasks the way a submit stores them (a
webhook_url unless ``--no-webhook``, one input image in the ``blobs`` table, a price), then
claims every one through ``Lifecycle.claim`` (reading its input) and completes every one
through ``Lifecycle.complete``, one transaction each, and prints this process's CPU time per
claim and per completion (``time.process_time``: on PostgreSQL the server's own CPU is not in it).
Each round uses fresh tasks; the best round is the figure, as the others only add noise
from a shared machine.

    .venv/bin/python benchmarks/complete_txn.py [--tasks 500] [--rounds 5]
        [--no-webhook] [--postgres | --database-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import cast

from sqlalchemy import Table, insert

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._harness import postgres_database  # noqa: E402
from tests.support.queued import queued_rows  # noqa: E402

from genhook.accounts import create_account  # noqa: E402
from genhook.config import Settings  # noqa: E402
from genhook.db import Blob, Database, Task, now_ms  # noqa: E402
from genhook.db.migrate import upgrade_in_thread  # noqa: E402
from genhook.storage import open_blob_store  # noqa: E402
from genhook.tasks import Lifecycle  # noqa: E402

MODEL = "bench/noop"
INFO = {"plan": [{"op": "grayscale"}, {"op": "border", "color": "red", "width": 12}]}


async def round_of(
    lifecycle: Lifecycle, account_id: str, count: int, webhook_url: str | None
) -> tuple[float, float]:
    """Microseconds of CPU per claim and per completion over ``count`` fresh tasks."""
    tasks, blobs = queued_rows(account_id, MODEL, count, now_ms() - 10_000, webhook_url)
    async with lifecycle.db.write() as session:
        connection = await session.connection()
        await connection.execute(insert(cast(Table, Task.__table__)), tasks)
        await connection.execute(insert(cast(Table, Blob.__table__)), blobs)
    claimed: list[str] = []
    start = time.process_time()
    for _ in range(count):
        inputs: dict[str, dict[str, bytes]] = {}
        (task,) = (await lifecycle.claim("bench-worker", [MODEL], inputs=inputs)).tasks
        assert inputs[task.id]
        claimed.append(task.id)
    claim_cpu = time.process_time() - start
    outputs = ["outputs/" + secrets.token_urlsafe(16) + ".jpeg"]
    start = time.process_time()
    for task_id in claimed:
        done = await lifecycle.complete(
            task_id, "bench-worker", outputs=outputs, nsfw=[False], info=INFO
        )
        assert done
    complete_cpu = time.process_time() - start
    return claim_cpu / count * 1e6, complete_cpu / count * 1e6


async def measure(label: str, url: str, data_dir: Path, args: argparse.Namespace) -> None:
    upgrade_in_thread(url)
    settings = Settings(
        data_dir=data_dir,
        database_url=url,
        public_base_url="https://genhook.example.com",
        webhook_allow_private_targets=True,
    )
    db = Database(url)
    try:
        account = await create_account(db, "bench")
        lifecycle = Lifecycle(settings, db, open_blob_store(settings, db))
        hook = None if args.no_webhook else "https://hooks.example.com/genhook?tenant=bench"
        await round_of(lifecycle, account.account_id, min(50, args.tasks), hook)  # warm up
        claims, completions = [], []
        for _ in range(args.rounds):
            claim_us, complete_us = await round_of(lifecycle, account.account_id, args.tasks, hook)
            claims.append(claim_us)
            completions.append(complete_us)
        print(
            f"{label}: {args.tasks} tasks x {args.rounds} rounds; CPU per claim "
            f"{min(claims):.0f} us (rounds: {' '.join(f'{v:.0f}' for v in claims)}), "
            f"per completion {min(completions):.0f} us "
            f"(rounds: {' '.join(f'{v:.0f}' for v in completions)})"
        )
    finally:
        await db.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-webhook", action="store_true", help="tasks without a webhook_url")
    parser.add_argument("--database-url", default=None, help="default: SQLite in a temp dir")
    parser.add_argument(
        "--postgres", action="store_true", help="also start a PostgreSQL server in a temp dir"
    )
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()}")
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        if args.database_url:
            asyncio.run(measure("given database", args.database_url, tmp / "data", args))
        else:
            url = f"sqlite+aiosqlite:///{tmp / 'genhook.db'}"
            asyncio.run(measure("sqlite", url, tmp / "data", args))
        if args.postgres:
            server = postgres_database(stack)
            asyncio.run(measure("postgres", server.url("bench"), tmp / "pg-data", args))
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
