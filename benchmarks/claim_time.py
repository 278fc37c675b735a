"""Claim time with a large backlog on PostgreSQL: the fair claim against the FIFO claim.

    .venv/bin/python benchmarks/claim_time.py [--waiting 100000] [--accounts 1000]
        [--claims 300] [--explain]

``--waiting`` tasks of one model over ``--accounts`` accounts are inserted server-side
(``generate_series``), each account's tags one estimate apart, as submits give them; then
``--claims`` claims of each kind are timed, alternating fair and FIFO in the same run, each
one ``Lifecycle.claim`` transaction (the worker's). Prints p50/p99 of each; with
``--explain``, then the plans of both claim statements (``EXPLAIN (ANALYZE, BUFFERS)``, each
rolled back).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _harness import percentile, postgres_database

from genhook.config import Settings
from genhook.db import Database, now_ms
from genhook.db.migrate import upgrade_in_thread
from genhook.storage.blobs import open_blob_store
from genhook.tasks import Lifecycle
from genhook.tasks.store.hot_path import claim_fair, claim_one, claim_params

MODEL = "bench/model"


def explain_sql(fair: bool) -> str:
    """The worker's claim statement with its parameters inlined, under EXPLAIN."""
    from sqlalchemy.dialects import postgresql

    models = (MODEL,)
    statement = claim_fair(models) if fair else claim_one(models)
    params = claim_params(models, "w-explain", now_ms(), 60_000, {})
    compiled = statement.compile(dialect=postgresql.dialect())
    sql = str(compiled)
    for name, value in compiled.construct_params(params).items():
        literal = str(value) if isinstance(value, int) else "'" + str(value) + "'"
        sql = sql.replace(f"%({name})s", literal)
    # As a worker's connection plans it (``Database(claims=True)``).
    return f"BEGIN; SET LOCAL enable_bitmapscan = off; EXPLAIN (ANALYZE, BUFFERS) {sql}; ROLLBACK;"


def fill_sql(waiting: int, accounts: int, now: int) -> list[str]:
    return [
        "INSERT INTO accounts (id, name, signing_secret, created_at) "
        f"SELECT 'a' || g, 'a' || g, 'x', {now} FROM generate_series(0, {accounts - 1}) g",
        "INSERT INTO tasks (id, account_id, model, kind, status, params, inputs, created_at, "
        "updated_at, available_at, deadline_at, attempts, lease_losses, outputs, "
        "has_nsfw_contents, info, charge, priority, fair_tag, fair_cost) "
        f"SELECT 't' || g, 'a' || (g % {accounts}), '{MODEL}', 'image', 'created', '{{}}', "
        f"'[]', {now - waiting} + g, {now}, {now - waiting} + g, {now + 3_600_000}, 0, 0, "
        f"'[]', '[]', '{{}}', '{{}}', 0, (g / {accounts}) * 1000000 + g % {accounts}, 1000000 "
        f"FROM generate_series(0, {waiting - 1}) g",
        "ANALYZE tasks",
    ]


async def main(args: argparse.Namespace) -> None:
    print(f"load: {Path('/proc/loadavg').read_text().strip()}")
    with contextlib.ExitStack() as stack:
        server = postgres_database(stack)
        url = server.url("bench")
        upgrade_in_thread(url)
        began = time.monotonic()
        for statement in fill_sql(args.waiting, args.accounts, now_ms()):
            server.rows(statement, database="bench")
        print(
            f"{args.waiting} waiting tasks over {args.accounts} accounts in "
            f"{time.monotonic() - began:.1f} s"
        )
        data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        db = Database(url, claims=True)
        try:
            kinds = {}
            for mode in ("fair", "fifo"):
                settings = Settings(data_dir=data_dir, database_url=url, scheduling=mode)
                kinds[mode] = Lifecycle(settings, db, open_blob_store(settings, db))
            times: dict[str, list[float]] = {"fair": [], "fifo": []}
            for index in range(2 * args.claims + 20):
                mode = "fair" if index % 2 else "fifo"
                start = time.perf_counter()
                claim = await kinds[mode].claim(f"w-{mode}", [MODEL], look_on=False)
                elapsed = (time.perf_counter() - start) * 1000
                assert claim.tasks
                if index >= 20:  # the first ones warm the pool and the caches
                    times[mode].append(elapsed)
        finally:
            await db.dispose()
        for mode, values in times.items():
            print(
                f"{mode}: claim p50 {percentile(values, 50):.2f} ms "
                f"p99 {percentile(values, 99):.2f} ms (n={len(values)})"
            )
        if args.explain:
            for fair in (True, False):
                print("fair" if fair else "fifo", "claim plan:")
                for row in server.rows(explain_sql(fair), database="bench"):
                    print("  ", *row)
    print(f"load: {Path('/proc/loadavg').read_text().strip()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiting", type=int, default=100_000)
    parser.add_argument("--accounts", type=int, default=1000)
    parser.add_argument("--claims", type=int, default=300)
    parser.add_argument("--explain", action="store_true", help="print both claims' plans")
    asyncio.run(main(parser.parse_args()))
