"""What the task API's controls cost on the submit path, and how fast cancel answers.

Starts ``genhook serve`` (GENHOOK_WORKERS=0, SQLite) and, in the same run, measures closed-loop
submit throughput and latency for: plain submits (the batched path), submits each with a new
``Idempotency-Key``, replays of one key, and submits under a per-account rate limit high enough
never to refuse (the limit path, which locks the account's row). Then it cancels waiting tasks
as fast as it can.

    .venv/bin/python benchmarks/task_api.py [--seconds 5] [--connections 16]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._harness import percentile  # noqa: E402
from benchmarks.submit import request_body, start_genhook  # noqa: E402


async def closed_loop(
    url: str,
    body: bytes,
    headers_for: Callable[[], dict[str, str]],
    seconds: float,
    connections: int,
) -> tuple[dict[str, float], list[str]]:
    latencies: list[float] = []
    ids: list[str] = []
    stop_at = time.perf_counter() + seconds

    async def client(session: aiohttp.ClientSession) -> None:
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            async with session.post(url, data=body, headers=headers_for()) as response:
                data = await response.json()
                assert response.status == 200, (response.status, data)
            latencies.append((time.perf_counter() - started) * 1000)
            ids.append(data["id"])

    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as session:
        began = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(connections)))
        elapsed = time.perf_counter() - began
    figures = {
        "rps": len(latencies) / elapsed,
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
    }
    return figures, ids


async def cancel_all(
    base: str, key: str, ids: list[str], connections: int
) -> tuple[dict[str, float], dict[int, int]]:
    headers = {"Authorization": f"Bearer {key}"}
    latencies: list[float] = []
    codes: dict[int, int] = {}
    queue = iter(ids)

    async def client(session: aiohttp.ClientSession) -> None:
        for task_id in queue:
            started = time.perf_counter()
            url = f"{base}/api/v1/model/result/{task_id}/cancel"
            async with session.post(url, headers=headers) as response:
                await response.read()
                codes[response.status] = codes.get(response.status, 0) + 1
            latencies.append((time.perf_counter() - started) * 1000)

    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as session:
        began = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(connections)))
        elapsed = time.perf_counter() - began
    figures = {
        "rps": len(latencies) / elapsed,
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
    }
    return figures, codes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args()
    print("load average at start:", " ".join(f"{x:.2f}" for x in os.getloadavg()))
    body = request_body()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        process, base, key = start_genhook(tmp, None)
        try:
            url = base + "/api/v1/model/generateImage"
            auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
            counter = itertools.count()
            runs: list[tuple[str, Callable[[], dict[str, str]]]] = [
                ("plain submit (batched path)", lambda: auth),
                (
                    "new Idempotency-Key each",
                    lambda: {**auth, "Idempotency-Key": f"k-{next(counter)}"},
                ),
                ("replay of one Idempotency-Key", lambda: {**auth, "Idempotency-Key": "k-0"}),
            ]
            results: list[tuple[str, dict[str, float]]] = []
            waiting: list[str] = []
            for label, headers_for in runs:
                figures, ids = asyncio.run(
                    closed_loop(url, body, headers_for, args.seconds, args.connections)
                )
                results.append((label, figures))
                if not waiting:
                    waiting = ids
            env = {
                **os.environ,
                "GENHOOK_DATA_DIR": str(tmp / "data"),
                "GENHOOK_LOG_LEVEL": "WARNING",
            }
            limits = ["--per-second", "1000000", "--in-flight", "100000000"]
            subprocess.run(
                [sys.executable, "-m", "genhook.cli", "accounts", "limits", "default", *limits],
                env=env,
                check=True,
                capture_output=True,
            )
            time.sleep(2.5)  # the api process's limit cache
            figures, _ = asyncio.run(
                closed_loop(url, body, lambda: auth, args.seconds, args.connections)
            )
            results.append(("rate and in-flight limits on (never refusing)", figures))
            cancel_figures, codes = asyncio.run(cancel_all(base, key, waiting, args.connections))
        finally:
            process.terminate()
            process.wait(30)
    plain = results[0][1]["rps"]
    print(f"\n{args.connections} connections, {args.seconds:g} s per run, SQLite, WORKERS=0")
    print(f"{'run':48} {'req/s':>8} {'vs plain':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for label, figures in results:
        print(
            f"{label:48} {figures['rps']:8.0f} {figures['rps'] / plain:9.0%} "
            f"{figures['p50']:8.2f} {figures['p99']:8.2f}"
        )
    print(
        f"{'cancel of waiting tasks':48} {cancel_figures['rps']:8.0f} {'':9} "
        f"{cancel_figures['p50']:8.2f} {cancel_figures['p99']:8.2f}   answers: {codes}"
    )
    print("load average at end:", " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
