"""Benchmark of a local diffusers model through the whole service against the pipeline alone.

In one run: the same InstructPix2Pix pipeline (tiny random weights on the CPU by default;
``--real-size`` builds one at Stable Diffusion 1.5's sizes in float16, random weights, no
download) is called directly in a loop in this process, then the same jobs go through
``genhook serve`` as it is deployed (the API, one worker with the model preloaded and a
dispatcher, each its own process; SQLite; outputs stored), submitted and polled over HTTP.
Prints tasks/s of both and their ratio, the time from ``genhook worker --preload`` starting to
its ``/readyz`` answering 200, the cost of a model switch (unload + load) and the service's
overhead per task.

    .venv/bin/python benchmarks/local_models.py                   # tiny pipeline, CPU
    .venv/bin/python benchmarks/local_models.py --device cuda --real-size --tasks 16 --steps 20
    .venv/bin/python benchmarks/local_models.py --concurrency 2   # pictures beside the calls
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._harness import (
    child_pythonpath,
    free_port,
    running_service,
    stop_process,
    wait_ready,
)

MODEL = "bench/ip2p"
PIPELINE = "StableDiffusionInstructPix2PixPipeline"
COLOR = (200, 30, 30)


def main(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="genhook-bench-local-"))
    try:
        return measure(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def measure(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from tests.support.tiny_pipelines import build_once

    weights = args.weights or root / "weights"
    started = time.perf_counter()
    build_once(PIPELINE, weights, real_size=args.real_size)
    built = time.perf_counter() - started
    generate = "512*512" if args.real_size else "32*32"
    entry = {
        "id": MODEL,
        "kind": "image",
        "pipeline": PIPELINE,
        "path": str(weights),
        "device": args.device,
        "dtype": "float16" if args.real_size else "float32",
        "steps": args.steps,
        "generate_size": generate,
        "sizes": ["1024*1024"],
    }
    side = int(generate.partition("*")[0])
    direct_seconds, switch_seconds = direct_loop(args, entry, side)

    settings = {
        "local_models": json.dumps([entry]),
        "preload_models": json.dumps([MODEL]),
        "workers": "1",
        "model_batching": json.dumps({MODEL: {"concurrency": args.concurrency}}),
        "local_models_affinity_seconds": "0",
    }
    data = root / "data"
    data.mkdir()
    with running_service(str(data), None, ready_timeout=300, **settings) as (base, key):
        service_seconds, calls = through_service(args, base, key, side)
    ready_seconds = worker_ready(data, settings)
    direct_rate = args.tasks / direct_seconds
    service_rate = args.tasks / service_seconds
    return {
        "device": args.device,
        "real_size": args.real_size,
        "steps": args.steps,
        "tasks": args.tasks,
        "concurrency": args.concurrency,
        "build_seconds": round(built, 2),
        "direct_tasks_per_second": round(direct_rate, 3),
        "service_tasks_per_second": round(service_rate, 3),
        "service_share_of_direct": round(service_rate / direct_rate, 3),
        "worker_start_to_ready_seconds": round(ready_seconds, 2),
        "model_switch_seconds": round(switch_seconds, 3),
        "overhead_ms_per_task": round(1000 * (service_seconds - direct_seconds) / args.tasks, 1),
        "direct_call_ms": round(1000 * direct_seconds / args.tasks, 1),
        # The pipeline calls' own time in the worker (the engine's info), and the share of the
        # run the device spent in them: the rest is the service's work around the calls.
        "service_call_ms": round(1000 * sum(calls) / len(calls), 1),
        "service_time_in_calls": round(sum(calls) / service_seconds, 3),
    }


def direct_loop(args: argparse.Namespace, entry: dict[str, Any], side: int) -> tuple[float, float]:
    """The pipeline alone, called as the engine calls it (one job per call, its own seed), and
    then a model switch as the worker makes one: unload, then load again."""
    from genhook.config import Settings
    from genhook.engines.local._config import LocalModel
    from genhook.engines.local._residency import RESIDENCY

    model = LocalModel.model_validate(entry)
    settings = Settings(local_models=[entry])
    direct_seconds = calls(args, RESIDENCY.pipeline(model, settings), side)
    started = time.perf_counter()
    RESIDENCY.unload(MODEL)
    RESIDENCY.pipeline(model, settings)
    switch_seconds = time.perf_counter() - started
    RESIDENCY.unload(MODEL)  # the service's worker loads its own copy
    return direct_seconds, switch_seconds


def calls(args: argparse.Namespace, pipe: Any, side: int) -> float:
    """Seconds for ``args.tasks`` calls after a warm-up one."""
    import torch
    from PIL import Image

    picture = Image.new("RGB", (side, side), COLOR)

    def call(seed: int) -> None:
        pipe(
            prompt=["make it blue"],
            image=[picture],
            num_inference_steps=args.steps,
            generator=[torch.Generator("cpu").manual_seed(seed)],
            output_type="pil",
        )

    call(0)
    started = time.perf_counter()
    for seed in range(args.tasks):
        call(seed)
    return time.perf_counter() - started


def through_service(
    args: argparse.Namespace, base: str, key: str, side: int
) -> tuple[float, list[float]]:
    """One warm-up task (serve's /readyz does not wait for the worker's preload), then
    ``args.tasks`` submitted at once; the run ends when the last one has."""
    import httpx
    from tests.support.images import data_url

    body = {
        "model": MODEL,
        "prompt": "make it blue",
        "images": [data_url(COLOR, size=side)],
        "size": "1024*1024",
        "output_format": "jpeg",
    }
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base, headers=headers, timeout=30) as client:

        def submit(seed: int) -> str:
            response = client.post("/api/v1/model/generateImage", json={**body, "seed": seed})
            response.raise_for_status()
            task: str = response.json()["id"]
            return task

        def wait(tasks: list[str], timeout: float) -> list[dict[str, Any]]:
            # The last task first, every 0.1 s: the API is its own process, so polling takes
            # nothing from the worker's.
            deadline = time.monotonic() + timeout
            while True:
                views = [client.get(f"/api/v1/model/result/{task}").json() for task in tasks[-1:]]
                if views[0]["status"] not in ("created", "processing"):
                    views = [client.get(f"/api/v1/model/result/{task}").json() for task in tasks]
                    if all(view["status"] not in ("created", "processing") for view in views):
                        return views
                if time.monotonic() > deadline:
                    raise RuntimeError(f"tasks still running after {timeout} s")
                time.sleep(0.1)

        (warm,) = wait([submit(0)], 300)
        assert warm["status"] == "completed", warm
        started = time.perf_counter()
        tasks = [submit(seed) for seed in range(args.tasks)]
        views = wait(tasks, 60 + 60 * args.tasks)
        seconds = time.perf_counter() - started
    assert all(view["status"] == "completed" for view in views), views
    return seconds, [view["info"]["seconds"] for view in views]


def worker_ready(data: Path, settings: dict[str, str]) -> float:
    """Seconds from ``genhook worker --preload`` starting (a new process: imports, the device,
    the weights) to its ``/readyz`` answering 200, on the database the service left."""
    port = free_port()
    env = {
        **os.environ,
        "GENHOOK_DATA_DIR": str(data),
        "PYTHONPATH": child_pythonpath(),
        "GENHOOK_LOG_LEVEL": "WARNING",
        **{f"GENHOOK_{name.upper()}": value for name, value in settings.items()},
    }
    command = [sys.executable, "-m", "genhook.cli", "worker", "--preload", MODEL]
    log = data.parent / "worker.log"
    with log.open("wb") as errors:
        started = time.perf_counter()
        worker = subprocess.Popen(
            [*command, "--health-port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=errors,
        )
    try:
        wait_ready(f"http://127.0.0.1:{port}/readyz", 300, worker, str(log))
        return time.perf_counter() - started
    finally:
        stop_process(worker)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--real-size", action="store_true", help="SD-1.5-sized, float16")
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="the model's calls at once in the worker (2: the next call's inputs and the last "
        "one's pictures are handled while a call holds the pipeline)",
    )
    parser.add_argument(
        "--weights",
        type=Path,
        help="build the pipeline here, or reuse the one already built here (kept)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse()
    print(f"load: {os.getloadavg()}", flush=True)
    figures = main(arguments)
    for name, value in figures.items():
        print(f"{name:32} {value}")
    print(f"load: {os.getloadavg()}", flush=True)
    if arguments.json:
        arguments.json.write_text(json.dumps(figures, indent=2))
