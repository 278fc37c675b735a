"""The CPU cost of OpenTelemetry traces per task: ``genhook serve`` with tracing off against
on, in one run.

    .venv/bin/python benchmarks/tracing.py [--tasks 300] [--rounds 2] [--concurrency 8]
    .venv/bin/python benchmarks/tracing.py --rate 50 --tasks 1000   # open loop, fixed rate

Each round starts the service twice on SQLite, untraced and then traced (OTLP over HTTP to a
receiver on loopback in this process that decodes every export, so the exporter does its whole
job), and sends ``--tasks`` tasks of the ``bench/noop`` model (``benchmarks/noop_engine.py``:
the engine does nothing, so what is measured is the service's own work, the worst case for a
relative overhead), each with a ``webhook_url`` on a loopback receiver. A round's figure is the
CPU time of the service's process tree from the first submit until the last webhook arrived,
per task. By default ``--concurrency`` clients submit back to back (a closed loop: the service
at full speed, where a slower side also batches its commits differently); with ``--rate``
the submits are sent at that fixed rate instead (an open loop, as ``e2e_latency.py``), so both
sides do the same work at the same pace and the difference is what tracing itself costs.
Rounds alternate so background load skews both sides alike; the best round of each side
counts. Exits non-zero when traced costs more than 10% over untraced.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._harness import role_of, running_service  # noqa: E402
from benchmarks._proc import cpu_seconds, descendants, main_thread_seconds  # noqa: E402
from benchmarks.noop_engine import PNG  # noqa: E402
from tests.support.otlp import OtlpHttpCollector  # noqa: E402

TARGET = 1.10


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


async def one_round(
    base: str, key: str, tasks: int, concurrency: int, rate: float = 0.0
) -> tuple[dict[str, float], float]:
    """CPU seconds per task of each role of the service tree, submit to the last webhook,
    and of their main threads alone: the event loops, where spans are made, apart from the
    threads beside them (the span exporter's among them)."""
    arrived = asyncio.Event()
    seen: set[str] = set()

    async def hook(request: web.Request) -> web.Response:
        seen.add((await request.json())["session_id"])
        if len(seen) >= tasks:
            arrived.set()
        return web.Response()

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    image = "data:image/png;base64," + base64.b64encode(PNG).decode()
    body = {
        "model": "bench/noop",
        "prompt": "noop",
        "images": [image],
        "size": "1024*1024",
        "webhook_url": f"http://127.0.0.1:{port}/hook",
    }
    tree = descendants(os.getpid())
    before = {pid: (cpu_seconds([pid]), main_thread_seconds(pid)) for pid in tree}
    try:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as http:
            queue = iter(range(tasks))

            async def submitter() -> None:
                for _ in queue:
                    await submit_one()

            async def submit_one() -> None:
                async with http.post(f"{base}/api/v1/model/generateImage", json=body) as r:
                    assert r.status == 200, await r.text()

            if rate:
                loop = asyncio.get_running_loop()
                began = loop.time()
                sent = []
                for index in range(tasks):
                    await asyncio.sleep(max(0.0, began + index / rate - loop.time()))
                    sent.append(asyncio.create_task(submit_one()))
                await asyncio.gather(*sent)
            else:
                await asyncio.gather(*(submitter() for _ in range(concurrency)))
            await asyncio.wait_for(arrived.wait(), 120)
        by_role: dict[str, float] = {}
        main = 0.0
        for pid, (start, main_start) in before.items():
            role = role_of(pid)
            by_role[role] = by_role.get(role, 0.0) + (cpu_seconds([pid]) - start) / tasks
            main += (main_thread_seconds(pid) - main_start) / tasks
        return by_role, main
    finally:
        await runner.cleanup()


def measure(
    traced: bool, collector: OtlpHttpCollector, args: argparse.Namespace
) -> tuple[dict[str, float], float]:
    otel = {
        "OTEL_TRACES_EXPORTER": "otlp" if traced else "none",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
    }
    with (
        tempfile.TemporaryDirectory() as data,
        environment(otel),
        running_service(
            data,
            None,
            extra_engines='["benchmarks.noop_engine:register"]',
            ready_timeout=300,
            webhook_allow_private_targets="true",
            # The service's defaults: wake-ups, with the slow safety-net polls. The harness's
            # 20 ms poll would bill each idle worker about 0.1 s of CPU a second, and so each
            # task the wall time it took, not the work it cost.
            worker_poll_seconds="5",
            webhook_poll_seconds="5",
        ) as (base, key),
    ):
        # Warm the processes (imports, first statements, connections) before measuring.
        asyncio.run(one_round(base, key, 20, args.concurrency))
        return asyncio.run(one_round(base, key, args.tasks, args.concurrency, args.rate))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--rate", type=float, default=0.0, help="submits per second, open loop (default: closed)"
    )
    args = parser.parse_args()
    collector = OtlpHttpCollector()
    results: dict[bool, list[float]] = {False: [], True: []}
    mains: dict[bool, list[float]] = {False: [], True: []}
    try:
        for round_ in range(args.rounds):
            for traced in (False, True):
                spans = len(collector.spans())
                roles, main = measure(traced, collector, args)
                cost = sum(roles.values())
                results[traced].append(cost)
                mains[traced].append(main)
                parts = ", ".join(f"{role} {ms * 1000:.2f}" for role, ms in sorted(roles.items()))
                print(
                    f"round {round_ + 1} {'traced  ' if traced else 'untraced'}: "
                    f"{cost * 1000:.2f} ms CPU per task ({parts}; main threads "
                    f"{main * 1000:.2f}, other threads {(cost - main) * 1000:.2f})"
                    + (f", {len(collector.spans()) - spans} spans exported" if traced else ""),
                    flush=True,
                )
    finally:
        collector.close()
    off, on = min(results[False]), min(results[True])
    ratio = on / off
    # The main threads of the round that counted: what making spans adds to the event loops.
    main_off = mains[False][results[False].index(off)]
    main_on = mains[True][results[True].index(on)]
    load = os.getloadavg()[0]
    print(
        f"best: untraced {off * 1000:.2f} ms, traced {on * 1000:.2f} ms CPU per task: "
        f"{(ratio - 1) * 100:+.1f}% (target <= {(TARGET - 1) * 100:.0f}%); main threads "
        f"{main_off * 1000:.2f} -> {main_on * 1000:.2f} ms, other threads "
        f"{(off - main_off) * 1000:.2f} -> {(on - main_on) * 1000:.2f} ms; load {load:.1f} "
        f"at {time.strftime('%Y-%m-%d %H:%M')}"
    )
    sys.exit(0 if ratio <= TARGET else 1)


if __name__ == "__main__":
    main()
