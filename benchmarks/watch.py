"""Waiting and watching on ``genhook serve``: how soon a waiting client hears that its task
ended, through the event stream and through ``Prefer: wait``, with many following at once.

    .venv/bin/python benchmarks/watch.py [--streams 200] [--waits 40] [--database-url URL]

Phase 1 opens ``--streams`` event streams at once, one per task (the test fake engine,
sleeping 0.2 s in 4 reported steps), and measures, per stream, the delay from the task's
``completed_at`` to the arrival of its terminal event. Phase 2 runs ``--waits`` short
tasks one after another with ``Prefer: wait=60`` and, as the baseline, with submit then a
poll every 0.5 s (the SDK's default first interval), and prints both round trips.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._harness import median, percentile, running_service  # noqa: E402


def image_url() -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 30, 30)).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


async def follow(
    session: aiohttp.ClientSession, base: str, headers: dict[str, str], body: dict[str, Any]
) -> tuple[float, float, float, int]:
    """(completed_at, when the stream opened, completed_at -> terminal event, events)."""
    async with session.post(f"{base}/api/v1/model/generateImage", json=body) as response:
        task = await response.json()
    events = 0
    url = f"{base}/api/v1/model/result/{task['id']}/events"
    async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(None)) as stream:
        opened = time.time()
        async for raw in stream.content:
            line = raw.decode().rstrip("\n")
            if not line.startswith("data: "):
                continue
            events += 1
            data = json.loads(line[6:])
            if data["status"] in ("completed", "failed"):
                ended = epoch(data["completed_at"])
                return ended, opened, time.time() - ended, events
    raise RuntimeError("stream ended without a terminal event")


async def run(base: str, key: str, streams: int, waits: int) -> None:
    auth = {"Authorization": f"Bearer {key}"}
    image = image_url()
    body = {"model": "test/fake-edit", "prompt": "sleep=0.2 steps=4", "images": [image]}
    body["size"] = "1024*1024"
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(headers=auth, connector=connector) as session:
        started = time.monotonic()
        results = await asyncio.gather(*(follow(session, base, auth, body) for _ in range(streams)))
        wall = time.monotonic() - started
        delays = [delay * 1000 for _, _, delay, _ in results]
        counts = [float(count) for *_, count in results]
        # Tasks that end once every stream is open, apart from the opening burst of requests.
        all_open = max(opened for _, opened, _, _ in results)
        steady = [delay * 1000 for ended, _, delay, _ in results if ended > all_open]
        print(
            f"event streams: {streams} at once, all ended in {wall:.1f} s; "
            f"completed_at -> terminal event p50 {median(delays):.1f} ms, "
            f"p99 {percentile(delays, 99):.1f} ms, max {max(delays):.1f} ms; "
            f"after the last stream opened ({len(steady)} tasks) p50 {median(steady):.1f} ms, "
            f"p99 {percentile(steady, 99):.1f} ms; events per stream median {median(counts):.0f}"
        )

        quick = dict(body, prompt="sleep=0.05")
        waited: list[float] = []
        for _ in range(waits):
            t0 = time.monotonic()
            async with session.post(
                f"{base}/api/v1/model/generateImage", json=quick, headers={"Prefer": "wait=60"}
            ) as response:
                data = await response.json()
            assert data["status"] == "completed", data
            waited.append((time.monotonic() - t0) * 1000)
        polled: list[float] = []
        for _ in range(waits):
            t0 = time.monotonic()
            async with session.post(f"{base}/api/v1/model/generateImage", json=quick) as response:
                task = await response.json()
            while True:
                await asyncio.sleep(0.5)
                async with session.get(f"{base}/api/v1/model/result/{task['id']}") as response:
                    data = await response.json()
                if data["status"] == "completed":
                    break
            polled.append((time.monotonic() - t0) * 1000)
        print(
            f"short task round trip: Prefer: wait median {median(waited):.0f} ms "
            f"(p99 {percentile(waited, 99):.0f}); submit + poll every 0.5 s median "
            f"{median(polled):.0f} ms (p99 {percentile(polled, 99):.0f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--waits", type=int, default=40)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_service(tmp, args.database_url, workers="2", test_deadline="600") as (base, key),
    ):
        asyncio.run(run(base, key, args.streams, args.waits))


if __name__ == "__main__":
    main()
