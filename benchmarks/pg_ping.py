"""What checking a pooled PostgreSQL connection costs a short transaction.

The same one-statement transaction, back to back and then one every ``--gap`` seconds (as at
a few tasks a second), on an engine with SQLAlchemy's ``pool_pre_ping`` (a ping of three
round trips at every checkout) and on one with the service's ``ping_when_idle`` (a ping only
after a second of idleness), in turn, on one PostgreSQL server. Prints this process's CPU
time and the wall time per transaction (medians of ``--rounds`` rounds) and the ratio.

    .venv/bin/python benchmarks/pg_ping.py [--transactions 2000] [--rounds 4] [--gap 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._harness import postgres_database  # noqa: E402
from sqlalchemy import text  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine  # noqa: E402

from genhook.db.database import PING_AFTER_IDLE_SECONDS, ping_when_idle  # noqa: E402

SELECT_ONE = text("SELECT 1")


def engine(url: str, variant: str) -> AsyncEngine:
    if variant == "pool_pre_ping":
        return create_async_engine(url, pool_size=4, pool_pre_ping=True)
    made = create_async_engine(url, pool_size=4, pool_use_lifo=True)
    ping_when_idle(made, PING_AFTER_IDLE_SECONDS)
    return made


async def per_transaction(url: str, variant: str, count: int, gap: float) -> tuple[float, float]:
    """CPU and wall microseconds per transaction (the wall time excludes the gaps)."""
    db = engine(url, variant)
    try:
        async with db.begin() as connection:  # connect outside the measurement
            await connection.execute(SELECT_ONE)
        cpu = wall = 0.0
        for _ in range(count):
            if gap:
                await asyncio.sleep(gap)
            began_cpu, began = time.process_time(), time.perf_counter()
            async with db.begin() as connection:
                await connection.execute(SELECT_ONE)
            cpu += time.process_time() - began_cpu
            wall += time.perf_counter() - began
        return cpu / count * 1e6, wall / count * 1e6
    finally:
        await db.dispose()


def run(url: str, count: int, gap: float, rounds: int) -> dict[str, Any]:
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    seen: dict[str, list[tuple[float, float]]] = {"pool_pre_ping": [], "ping_when_idle": []}
    for _ in range(rounds):
        for variant, results in seen.items():
            results.append(runner(per_transaction(url, variant, count, gap)))
    return {
        variant: (
            statistics.median(cpu for cpu, _ in results),
            statistics.median(wall for _, wall in results),
        )
        for variant, results in seen.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--gap", type=float, default=0.1, help="seconds between the spaced ones")
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()}")
    with contextlib.ExitStack() as stack:
        url = postgres_database(stack).url("bench")
        for label, count, gap in (
            ("back to back", args.transactions, 0.0),
            (
                f"one every {args.gap:g} s",
                max(1, min(args.transactions, int(6 / args.gap))),
                args.gap,
            ),
        ):
            figures = run(url, count, gap, args.rounds)
            (pre_cpu, pre_wall), (ours_cpu, ours_wall) = figures.values()
            print(
                f"{label}, {count} transactions x {args.rounds} rounds: "
                f"pool_pre_ping {pre_cpu:.0f} us CPU, {pre_wall:.0f} us wall; "
                f"ping_when_idle {ours_cpu:.0f} us CPU, {ours_wall:.0f} us wall "
                f"({ours_cpu / pre_cpu:.0%} of the CPU, {ours_wall / pre_wall:.0%} of the wall)"
            )
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
