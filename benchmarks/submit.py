"""Submit throughput and latency of ``genhook serve`` on SQLite and PostgreSQL.

Each run POSTs edit requests carrying a ~8 KB data-URL image to a running service on
loopback, and in the same run measures a bare FastAPI endpoint returning constant JSON (the
ceiling). Peak throughput comes from wrk (Debian package ``wrk``) when installed, otherwise
from an asyncio client; latency at a fixed offered rate comes from an open-loop asyncio
client that times each request from its scheduled send time (no coordinated omission).

    .venv/bin/python benchmarks/submit.py [--seconds 10] [--rate 500] [--connections 64]

The service runs with GENHOOK_WORKERS=0 so the figures are the API's alone.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from contextlib import ExitStack
from pathlib import Path

import aiohttp
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._harness import free_port, percentile, postgres_database, wait_ready  # noqa: E402

CEILING_APP = textwrap.dedent(
    """
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    app = FastAPI()
    BODY = {"id": "0" * 32, "model": "genhook/image-edit", "status": "created", "outputs": [],
            "has_nsfw_contents": [], "created_at": "2026-01-01T00:00:00.000Z",
            "urls": {"get": "http://127.0.0.1/api/v1/model/result/0"}}

    @app.post("/api/v1/model/generateImage")
    async def submit() -> JSONResponse:
        return JSONResponse(BODY)

    @app.get("/readyz")
    async def ready() -> dict[str, str]:
        return {"status": "ready"}
    """
)


def request_body() -> bytes:
    noise = Image.frombytes("RGB", (48, 48), os.urandom(48 * 48 * 3))
    buffer = io.BytesIO()
    noise.save(buffer, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    body = {"model": "genhook/image-edit", "prompt": "make it black and white", "images": [url]}
    return json.dumps(body).encode()


def start_genhook(tmp: Path, database_url: str | None) -> tuple[subprocess.Popen[bytes], str, str]:
    port = free_port()
    env = {
        **os.environ,
        "GENHOOK_DATA_DIR": str(tmp / "data"),
        "GENHOOK_PORT": str(port),
        "GENHOOK_WORKERS": "0",
        "GENHOOK_LOG_LEVEL": "WARNING",
    }
    if database_url:
        env["GENHOOK_DATABASE_URL"] = database_url
    process = subprocess.Popen(
        [sys.executable, "-m", "genhook.cli", "serve"],
        env=env,
        stdout=(tmp / "serve.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    wait_ready(base + "/readyz")
    key = json.loads((tmp / "data" / "credentials.json").read_text())["api_key"]
    return process, base, key


def start_ceiling(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    (tmp / "ceiling_app.py").write_text(CEILING_APP)
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "ceiling_app:app",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        cwd=tmp,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    wait_ready(base + "/readyz")
    return process, base


def run_wrk(url: str, key: str, body: bytes, seconds: int, connections: int) -> dict[str, float]:
    script = Path(tempfile.mkstemp(suffix=".lua")[1])
    script.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(body.decode())}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Authorization"] = "Bearer {key}"\n'
    )
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    script.unlink()
    if "Non-2xx" in out:
        raise RuntimeError("wrk saw error responses:\n" + out)

    def ms(label: str) -> float:
        match = re.search(rf"^\s+{label}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        assert match, out
        value = float(match.group(1))
        return (
            value / 1000
            if match.group(2) == "us"
            else value * 1000
            if match.group(2) == "s"
            else value
        )

    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    return {"rps": rps, "p50": ms("50"), "p99": ms("99")}


async def closed_loop(
    url: str, key: str, body: bytes, seconds: int, connections: int
) -> dict[str, float]:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds

    async def client(session: aiohttp.ClientSession) -> None:
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                assert response.status == 200, response.status
            latencies.append((time.perf_counter() - started) * 1000)

    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as session:
        began = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(connections)))
        elapsed = time.perf_counter() - began
    return {
        "rps": len(latencies) / elapsed,
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
    }


async def open_loop(
    url: str, key: str, body: bytes, rate: float, seconds: float
) -> dict[str, float]:
    """Send at a fixed rate regardless of responses; latency counts from the scheduled time."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    latencies: list[float] = []
    errors = 0
    total = int(rate * seconds)
    connector = aiohttp.TCPConnector(limit=256)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter() + 0.1

        async def one(scheduled: float) -> None:
            nonlocal errors
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                if response.status != 200:
                    errors += 1
            latencies.append((time.perf_counter() - scheduled) * 1000)

        await asyncio.gather(*(one(start + i / rate) for i in range(total)))
    return {
        "offered": rate,
        "done": len(latencies),
        "errors": errors,
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
    }


def measure(
    name: str, url: str, key: str, body: bytes, args: argparse.Namespace
) -> dict[str, float]:
    # Warm up (connections, caches, SQLite pages) before measuring.
    asyncio.run(closed_loop(url, key, body, 1, 8))
    if shutil.which("wrk") and not args.no_wrk:
        peak = run_wrk(url, key, body, args.seconds, args.connections)
        peak["tool"] = "wrk"  # type: ignore[assignment]
    else:
        peak = asyncio.run(closed_loop(url, key, body, args.seconds, args.connections))
        peak["tool"] = "asyncio"  # type: ignore[assignment]
    rated = asyncio.run(open_loop(url, key, body, args.rate, args.seconds))
    print(
        f"  {name:<10} peak {peak['rps']:8.0f} req/s  p50 {peak['p50']:6.2f} ms  "
        f"p99 {peak['p99']:6.2f} ms  ({peak['tool']}, {args.connections} connections)"
    )
    print(
        f"  {'':<10} at {args.rate:.0f}/s offered: p50 {rated['p50']:6.2f} ms  p99 "
        f"{rated['p99']:6.2f} ms  ({rated['done']:.0f} requests, {rated['errors']:.0f} errors)"
    )
    return {**peak, "rated_p50": rated["p50"], "rated_p99": rated["p99"]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rate", type=float, default=500)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument(
        "--no-wrk", action="store_true", help="use the asyncio client for peak load"
    )
    parser.add_argument("--skip-postgres", action="store_true")
    args = parser.parse_args()
    body = request_body()
    print(f"submit benchmark: {len(body)} byte request bodies, {os.cpu_count()} CPUs")
    results: dict[str, dict[str, float]] = {}
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        ceiling, base = start_ceiling(tmp)
        stack.callback(ceiling.terminate)
        results["ceiling"] = measure(
            "ceiling", base + "/api/v1/model/generateImage", "x", body, args
        )
        ceiling.terminate()
        ceiling.wait()

        backends: list[tuple[str, str | None]] = [("sqlite", None)]
        if not args.skip_postgres:
            server = postgres_database(stack)
            backends.append(("postgres", server.url("bench")))
        for name, url in backends:
            run_dir = tmp / name
            run_dir.mkdir()
            process, service, key = start_genhook(run_dir, url)
            try:
                results[name] = measure(
                    name, service + "/api/v1/model/generateImage", key, body, args
                )
            finally:
                process.terminate()
                process.wait(30)
    print()
    ceiling_rps = results["ceiling"]["rps"]
    for name in ("sqlite", "postgres"):
        if name in results:
            ratio = results[name]["rps"] / ceiling_rps
            print(
                f"{name:<9} {results[name]['rps']:7.0f} submits/s = {ratio:5.1%} of the bare "
                f"FastAPI ceiling ({ceiling_rps:.0f} req/s); p99 at {args.rate:.0f}/s offered: "
                f"{results[name]['rated_p99']:.2f} ms"
            )


if __name__ == "__main__":
    main()
