"""Benchmark of a local diffusers model through the whole service against the pipeline alone.

In one run: the same InstructPix2Pix pipeline (tiny random weights on the CPU by default;
``--real-size`` builds one at Stable Diffusion 1.5's sizes in float16, random weights, no
download) is called directly in a loop in this process, and the same jobs go through
``genhook serve`` as it is deployed (the API, one worker with the model preloaded and a
dispatcher, each its own process; SQLite; outputs stored), submitted and polled over HTTP.
The two take turns, ``--rounds`` times: a shared machine's speed drifts by a third within a
minute, and a drift then falls on both sides alike. Prints tasks/s of both and their ratio
(over all rounds, and each round's), the time from ``genhook worker --preload`` starting to
its ``/readyz`` answering 200, the cost of a model switch (unload + load) and the service's
overhead per task.

    .venv/bin/python benchmarks/local_models.py                   # tiny pipeline, CPU
    .venv/bin/python benchmarks/local_models.py --device cuda --real-size --tasks 8 --steps 20
    .venv/bin/python benchmarks/local_models.py --concurrency 2   # pictures beside the calls
    .venv/bin/python benchmarks/local_models.py --concurrency 2 --threads 1   # a card's shape
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
    pipe = direct_pipeline(entry)

    settings = {
        "local_models": json.dumps([entry]),
        "preload_models": json.dumps([MODEL]),
        "workers": str(args.workers),
        "model_batching": json.dumps({MODEL: {"concurrency": args.concurrency}}),
        "local_models_affinity_seconds": "0",
        "local_models_cpu_threads": str(args.threads),
    }
    data = root / "data"
    data.mkdir()
    rounds: list[tuple[float, float]] = []
    in_calls: list[float] = []
    with running_service(str(data), None, ready_timeout=300, **settings) as (base, key):
        service = ServiceClient(base, key, side)
        # Warm-ups (the first call of each is the slowest; serve's /readyz does not wait for
        # the worker's preload), then the rounds.
        calls(args, pipe, side, seeds=[0])
        service.run([0])
        for number in range(args.rounds):
            seeds = list(range(number * args.tasks, (number + 1) * args.tasks))
            direct_seconds = calls(args, pipe, side, seeds)
            service_seconds, seconds = service.run(seeds)
            rounds.append((direct_seconds, service_seconds))
            in_calls.extend(seconds)
        service.client.close()
    switch_seconds = model_switch(entry)
    ready_seconds = worker_ready(data, settings)
    total = args.tasks * args.rounds
    direct_seconds = sum(direct for direct, _ in rounds)
    service_seconds = sum(service for _, service in rounds)
    direct_rate = total / direct_seconds
    service_rate = total / service_seconds
    return {
        "device": args.device,
        "real_size": args.real_size,
        "steps": args.steps,
        "tasks": f"{args.rounds} rounds of {args.tasks}",
        "concurrency": args.concurrency,
        "workers": args.workers,
        "threads": args.threads or "default",
        "build_seconds": round(built, 2),
        "direct_tasks_per_second": round(direct_rate, 3),
        "service_tasks_per_second": round(service_rate, 3),
        "service_share_of_direct": round(service_rate / direct_rate, 3),
        "share_each_round": [round(direct / service, 3) for direct, service in rounds],
        "worker_start_to_ready_seconds": round(ready_seconds, 2),
        "model_switch_seconds": round(switch_seconds, 3),
        "overhead_ms_per_task": round(1000 * (service_seconds - direct_seconds) / total, 1),
        "direct_call_ms": round(1000 * direct_seconds / total, 1),
        # The pipeline calls' own time in the worker (the engine's info), and the share of the
        # run the device spent in them: the rest is the service's work around the calls.
        "service_call_ms": round(1000 * sum(in_calls) / len(in_calls), 1),
        "service_time_in_calls": round(sum(in_calls) / service_seconds, 3),
    }


def direct_pipeline(entry: dict[str, Any]) -> Any:
    """The pipeline as the engine loads it, in this process."""
    from genhook.config import Settings
    from genhook.engines.local._config import LocalModel
    from genhook.engines.local._residency import RESIDENCY

    return RESIDENCY.pipeline(LocalModel.model_validate(entry), Settings(local_models=[entry]))


def model_switch(entry: dict[str, Any]) -> float:
    """Seconds of a model switch as the worker makes one: unload, then load again."""
    from genhook.engines.local._residency import RESIDENCY

    started = time.perf_counter()
    RESIDENCY.unload(MODEL)
    direct_pipeline(entry)
    seconds = time.perf_counter() - started
    RESIDENCY.unload(MODEL)
    return seconds


def calls(args: argparse.Namespace, pipe: Any, side: int, seeds: list[int]) -> float:
    """Seconds for one call per seed, one after another."""
    import torch
    from PIL import Image

    picture = Image.new("RGB", (side, side), COLOR)
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    for seed in seeds:
        pipe(
            prompt=["make it blue"],
            image=[picture],
            num_inference_steps=args.steps,
            generator=[torch.Generator("cpu").manual_seed(seed)],
            output_type="pil",
        )
    return time.perf_counter() - started


class ServiceClient:
    """The same jobs as tasks of the running service, over HTTP."""

    def __init__(self, base: str, key: str, side: int) -> None:
        import httpx
        from tests.support.images import data_url

        self.client = httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=90
        )
        self.body = {
            "model": MODEL,
            "prompt": "make it blue",
            "images": [data_url(COLOR, size=side)],
            "size": "1024*1024",
            "output_format": "jpeg",
        }

    def run(self, seeds: list[int]) -> tuple[float, list[float]]:
        """Seconds from submitting a task per seed, all at once, until the last one ended
        (each waited for in turn with ``Prefer: wait``, so the last end is seen at once, not
        at the next poll); and each pipeline call's own seconds, from the engine's info."""
        started = time.perf_counter()
        tasks = [self.submit(seed) for seed in seeds]
        views = [self.wait(task) for task in tasks]
        seconds = time.perf_counter() - started
        assert all(view["status"] == "completed" for view in views), views
        return seconds, [view["info"]["seconds"] for view in views]

    def submit(self, seed: int) -> str:
        response = self.client.post("/api/v1/model/generateImage", json={**self.body, "seed": seed})
        response.raise_for_status()
        task: str = response.json()["id"]
        return task

    def wait(self, task: str) -> dict[str, Any]:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            response = self.client.get(
                f"/api/v1/model/result/{task}", headers={"Prefer": "wait=60"}
            )
            response.raise_for_status()
            view: dict[str, Any] = response.json()
            if view["status"] not in ("created", "processing"):
                return view
        raise RuntimeError(f"task {task} still running after 600 s")


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
    parser.add_argument("--tasks", type=int, default=8, help="tasks a round, on each side")
    parser.add_argument(
        "--rounds", type=int, default=3, help="turns of the direct loop and the service"
    )
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="the model's calls at once in the worker (2: the next call's inputs and the last "
        "one's pictures are handled while a call holds the pipeline)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes of the service, each with the model (2: serve's default)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="CPU threads of the calls, in the loop and in the worker (0: torch's default in "
        "the loop, the process's share in the worker). 1 makes a CPU call bound by its "
        "thread, as a card's call is, and leaves the other cores to the service's other work",
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
