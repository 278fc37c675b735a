"""A trivial predictor three ways, in one run: its ``predict`` called in a loop, served by
``genhook serve`` (a ``"cog"`` entry), and served by Cog's own server
(``python -m cog.server.http``).

    .venv/bin/python benchmarks/predictor.py [--rate 10] [--seconds 20] [--calls 2000]

The predictor is ``benchmarks/trivial_predictor`` (a Cog project: ``predict`` repeats a
string), so all three run the same file. Requests go out open loop at ``--rate`` per second
from scheduled send times. genhook's latency runs from the scheduled send to the receipt of
the task's signed webhook (submit, queue, worker, completion, dispatcher); Cog's from the
scheduled send to the answer of its synchronous ``POST /predictions`` and, a second time,
to the receipt of its (unsigned) webhook of an asynchronous prediction
(``Prefer: respond-async``). Overhead per task: a median latency less the median direct call.
Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._harness import (  # noqa: E402
    free_port,
    is_service,
    percentile,
    running_service,
    stop_process,
)
from benchmarks._proc import cpu_seconds, descendants  # noqa: E402

PROJECT = ROOT / "benchmarks" / "trivial_predictor"
MODEL = "bench/trivial-predictor"
INPUTS = {"text": "ab", "times": 3}
DRAIN_SECONDS = 30.0


class Receiver:
    """A loopback webhook receiver: when each callback arrived, by the id it names."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.arrived: dict[str, float] = {}
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        now = time.monotonic()
        data = json.loads(await request.read())
        status = data.get("status")
        if status in ("succeeded", "failed", "canceled") or self.key == "session_id":
            self.arrived.setdefault(str(data.get(self.key)), now)
        return web.Response(status=200)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}/hook"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def direct(calls: int) -> dict[str, float]:
    """``predict`` in a loop in this process: the floor every server adds to."""
    from genhook.engines.predictor._config import load_cog_class

    predictor = load_cog_class(PROJECT)()
    predictor.setup()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        predictor.predict(**INPUTS)
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return {"calls": calls, "p50_ms": percentile(times, 50), "p99_ms": percentile(times, 99)}


async def open_loop(
    rate: float,
    seconds: float,
    send: Any,
    arrived: dict[str, float] | None,
    server: int | None = None,
) -> dict[str, Any]:
    """Send ``rate * seconds`` requests on schedule; ``send(client, scheduled)`` returns the
    request's id and, for a synchronous answer, when it came. With ``arrived`` (a
    receiver's), a request ends at its webhook. ``server``: the serving process, whose
    tree's CPU time per completed request is reported (steadier than latency on a loaded
    machine)."""
    tree = [server, *descendants(server)] if server is not None else []
    cpu_before = cpu_seconds(tree)
    ended: dict[str, float] = {}
    started: dict[str, float] = {}
    failures = 0
    reasons: dict[str, int] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client:

        async def one(scheduled: float) -> None:
            nonlocal failures
            try:
                ident, answered = await send(client, scheduled)
            except (aiohttp.ClientError, ValueError, KeyError) as exc:
                failures += 1
                reason = str(exc)[:80] or type(exc).__name__
                reasons[reason] = reasons.get(reason, 0) + 1
                return
            started[ident] = scheduled
            if arrived is None:
                ended[ident] = answered

        begin = time.monotonic()
        pending = []
        for index in range(int(rate * seconds)):
            scheduled = begin + index / rate
            delay = scheduled - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            pending.append(asyncio.create_task(one(scheduled)))
        await asyncio.gather(*pending)
        if arrived is not None:
            deadline = time.monotonic() + DRAIN_SECONDS
            while time.monotonic() < deadline and any(i not in arrived for i in started):
                await asyncio.sleep(0.05)
            ended = {i: arrived[i] for i in started if i in arrived}
    cpu = cpu_seconds(tree) - cpu_before
    latencies = sorted((ended[i] - s) * 1000 for i, s in started.items() if i in ended)
    return {
        "server_cpu_ms_per_request": cpu * 1000 / max(1, len(latencies)),
        "requests": len(started) + failures,
        "failed": failures,
        "why_failed": reasons,
        "lost": len(started) - len(latencies),
        "p50_ms": percentile(latencies, 50),
        "p90_ms": percentile(latencies, 90),
        "p99_ms": percentile(latencies, 99),
        "max_ms": latencies[-1] if latencies else float("nan"),
    }


async def genhook_run(rate: float, seconds: float) -> dict[str, Any]:
    receiver = Receiver("session_id")
    await receiver.start()
    entry = [{"id": MODEL, "kind": "image", "cog": str(PROJECT)}]
    try:
        with (
            tempfile.TemporaryDirectory(prefix="genhook-bench-predictor-") as data_dir,
            running_service(
                data_dir,
                None,
                ready_timeout=180.0,
                models=json.dumps(entry),
                workers="1",
                preload_models=json.dumps([MODEL]),
                webhook_allow_private_targets="true",
            ) as (base, key),
        ):
            headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
            payload = json.dumps({"model": MODEL, **INPUTS, "webhook_url": receiver.url})

            async def send(client: aiohttp.ClientSession, scheduled: float) -> tuple[str, float]:
                url = base + "/api/v1/model/generateImage"
                async with client.post(url, data=payload, headers=headers) as response:
                    body = await response.read()
                    if response.status != 200:
                        raise ValueError(body[:200])
                    return str(json.loads(body)["id"]), time.monotonic()

            await open_loop(rate, min(seconds, 3.0), send, receiver.arrived)  # warm-up
            supervisor = next(p for p in descendants(os.getpid()) if is_service(p))
            return await open_loop(rate, seconds, send, receiver.arrived, supervisor)
    finally:
        await receiver.stop()


async def cog_run(rate: float, seconds: float) -> dict[str, Any]:
    port = free_port()
    env = {
        **os.environ,
        "PORT": str(port),
        "COG_PREDICT_TYPE_STUB": "predict.py:Predictor",
        # Cog's worker subprocess is started as ``python`` from PATH: this interpreter's.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    log = tempfile.NamedTemporaryFile(prefix="cog-server-", suffix=".log")  # noqa: SIM115
    server = subprocess.Popen(
        [sys.executable, "-m", "cog.server.http", "--host", "127.0.0.1"],
        cwd=PROJECT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    receiver = Receiver("id")
    await receiver.start()
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as client:
            deadline = time.monotonic() + 180.0
            while True:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"Cog's server did not start: {Path(log.name).read_text()}")
                try:
                    async with client.get(base + "/health-check") as response:
                        if (await response.json()).get("status") == "READY":
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)
        sync_body = json.dumps({"input": INPUTS})
        json_type = {"Content-Type": "application/json"}
        counter = iter(range(10**9))

        async def sync(client: aiohttp.ClientSession, scheduled: float) -> tuple[str, float]:
            async with client.post(
                base + "/predictions", data=sync_body, headers=json_type
            ) as response:
                body = json.loads(await response.read())
                if body.get("status") != "succeeded":
                    raise ValueError(str(body)[:200])
                return str(next(counter)), time.monotonic()

        async def hooked(client: aiohttp.ClientSession, scheduled: float) -> tuple[str, float]:
            ident = f"bench{next(counter)}"
            body = json.dumps({"id": ident, "input": INPUTS, "webhook": receiver.url})
            headers = {**json_type, "Prefer": "respond-async"}
            async with client.post(base + "/predictions", data=body, headers=headers) as response:
                await response.read()
                if response.status >= 300:
                    raise ValueError(f"HTTP {response.status}")
            return ident, time.monotonic()

        await open_loop(rate, min(seconds, 3.0), sync, None)  # warm-up
        results = {"sync": await open_loop(rate, seconds, sync, None, server.pid)}
        results["webhook"] = await open_loop(rate, seconds, hooked, receiver.arrived, server.pid)
        return results
    finally:
        await receiver.stop()
        stop_process(server)
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    loop = direct(args.calls)
    service = asyncio.run(genhook_run(args.rate, args.seconds))
    cog = asyncio.run(cog_run(args.rate, args.seconds))
    floor = loop["p50_ms"]
    print(
        json.dumps(
            {
                "rate_per_s": args.rate,
                "seconds": args.seconds,
                "load_before": load_before,
                "load_after": Path("/proc/loadavg").read_text().split()[:3],
                "direct_loop": loop,
                "genhook_to_webhook": service,
                "cog_sync_response": cog["sync"],
                "cog_to_webhook": cog["webhook"],
                "overhead_p50_ms": {
                    "genhook_to_webhook": service["p50_ms"] - floor,
                    "cog_sync_response": cog["sync"]["p50_ms"] - floor,
                    "cog_to_webhook": cog["webhook"]["p50_ms"] - floor,
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
