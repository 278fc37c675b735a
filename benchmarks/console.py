"""The web console on ``genhook serve``: how long its pages take next to the API calls they
are made of, with a page of tasks to list.

    .venv/bin/python benchmarks/console.py [--tasks 50] [--rounds 30] [--database-url URL]

Submits ``--tasks`` tasks (the test fake engine), waits for them to end, then times, over
real HTTP on loopback, ``--rounds`` sequential requests each of: the task listing of the API
and of the console, one result of the API and the console's task page (which also reads the
task's deliveries, usage lines and model), and the console's usage page.
"""

from __future__ import annotations

import argparse
import base64
import io
import re
import sys
import tempfile
import time
from pathlib import Path

import httpx
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._harness import median, percentile, running_service  # noqa: E402


def image_url() -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 30, 30)).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def timed(client: httpx.Client, path: str, rounds: int, **kwargs: object) -> list[float]:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        response = client.get(path, **kwargs)  # type: ignore[arg-type]
        times.append((time.perf_counter() - start) * 1000)
        assert response.status_code == 200, (path, response.status_code, response.text[:200])
    return times


def run(base: str, key: str, tasks: int, rounds: int) -> None:
    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base, timeout=60) as client:
        body = {"model": "test/fake-edit", "prompt": "edit", "images": [image_url()]}
        ids = [
            client.post("/api/v1/model/generateImage", json=body, headers=auth).json()["id"]
            for _ in range(tasks)
        ]
        for task_id in ids:
            while client.get(f"/api/v1/model/result/{task_id}", headers=auth).json()[
                "status"
            ] not in {"completed", "failed"}:
                time.sleep(0.05)
        login = client.post("/console/login", data={"api_key": key})
        assert login.status_code == 303, login.text
        assert re.search("genhook_console=", login.headers["set-cookie"])
        rows = [
            ("API  GET /api/v1/model/results?limit=50", "/api/v1/model/results?limit=50", auth),
            ("page GET /console/tasks (50 rows)", "/console/tasks", {}),
            ("API  GET /api/v1/model/result/{id}", f"/api/v1/model/result/{ids[0]}", auth),
            ("page GET /console/tasks/{id}", f"/console/tasks/{ids[0]}", {}),
            ("page GET /console/usage", "/console/usage", {}),
        ]
        print(f"{tasks} tasks, {rounds} sequential requests each; milliseconds")
        print(f"{'request':44} {'median':>8} {'p95':>8}")
        for label, path, headers in rows:
            times = timed(client, path, rounds, headers=headers)
            print(f"{label:44} {median(times):8.1f} {percentile(times, 95):8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_service(tmp, args.database_url, workers="1") as (base, key),
    ):
        run(base, key, args.tasks, args.rounds)


if __name__ == "__main__":
    main()
