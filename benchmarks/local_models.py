"""Benchmark of a local diffusers model through the whole service against the pipeline alone.

In one run: the same InstructPix2Pix pipeline (tiny random weights on the CPU by default;
``--real-size`` builds one at Stable Diffusion 1.5's sizes in float16, random weights, no
download) is called directly in a loop, then the same jobs go through the service (submit
over the API in-process, SQLite, the worker with its pipeline preloaded, outputs stored).
Prints tasks/s of both and their ratio, the worker's time from start to ready with the model
preloaded, the cost of a model switch (unload + load) and the service's overhead per task.

    .venv/bin/python benchmarks/local_models.py                   # tiny pipeline, CPU
    .venv/bin/python benchmarks/local_models.py --device cuda --real-size --tasks 20
    .venv/bin/python benchmarks/local_models.py --concurrency 2   # pictures beside the calls
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


async def main(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from PIL import Image
    from tests.conftest import make_harness, make_settings
    from tests.support.images import data_url
    from tests.support.tiny_pipelines import build

    from genhook.engines.local._config import LocalModel
    from genhook.engines.local._residency import RESIDENCY, effective_dtype, load_pipeline

    pipeline = "StableDiffusionInstructPix2PixPipeline"
    root = Path(tempfile.mkdtemp(prefix="genhook-bench-local-"))
    started = time.perf_counter()
    build(pipeline, root / "weights", real_size=args.real_size)
    built = time.perf_counter() - started
    generate = "512*512" if args.real_size else "32*32"
    entry = {
        "id": "bench/ip2p",
        "kind": "image",
        "pipeline": pipeline,
        "path": str(root / "weights"),
        "device": args.device,
        "dtype": "float16" if args.real_size else "float32",
        "steps": args.steps,
        "generate_size": generate,
        "sizes": ["1024*1024"],
    }
    model = LocalModel.model_validate(entry)
    side = int(generate.partition("*")[0])

    # The pipeline alone, called as the engine calls it (one job per call, its own seed).
    dtype = effective_dtype(model.dtype, args.device)
    pipe = load_pipeline(model, args.device, dtype)
    picture = Image.new("RGB", (side, side), (200, 30, 30))

    def direct(seed: int) -> None:
        pipe(
            prompt=["make it blue"],
            image=[picture],
            num_inference_steps=args.steps,
            generator=[torch.Generator("cpu").manual_seed(seed)],
            output_type="pil",
        )

    direct(0)
    started = time.perf_counter()
    for seed in range(args.tasks):
        direct(seed)
    direct_seconds = time.perf_counter() - started
    pipe.to("cpu")  # the service loads its own copy

    settings = make_settings(
        root,
        f"sqlite+aiosqlite:///{root / 'genhook.db'}",
        local_models=[entry],
        preload_models=["bench/ip2p"],
        extra_engines=[],
        local_models_affinity_seconds=0.0,
        model_batching={"bench/ip2p": {"concurrency": args.concurrency}},
    )
    harness = await make_harness(settings)
    try:
        started = time.perf_counter()
        await harness.worker.preload()
        ready_seconds = time.perf_counter() - started
        body = {
            "model": "bench/ip2p",
            "prompt": "make it blue",
            "images": [data_url((200, 30, 30), size=side)],
            "size": "1024*1024",
            "output_format": "jpeg",
        }
        # One warm-up task, then the measured ones.
        await harness.submit({**body, "seed": 0})
        await harness.run_all()
        stop = asyncio.Event()
        running = asyncio.create_task(harness.worker.run(stop))
        started = time.perf_counter()
        ids = []
        for seed in range(args.tasks):
            response = await harness.submit({**body, "seed": seed})
            ids.append(response.json()["id"])
        while True:
            # A poll every 0.2 s, the last task first: the API answers in this process, and
            # tight polling would take the interpreter from the thread driving the pipeline.
            if (await harness.result(ids[-1]))["status"] in ("created", "processing"):
                await asyncio.sleep(0.2)
                continue
            states = [(await harness.result(task))["status"] for task in ids]
            if all(state in ("completed", "failed", "timeout") for state in states):
                break
            await asyncio.sleep(0.2)
        service_seconds = time.perf_counter() - started
        stop.set()
        await running
        assert all(state == "completed" for state in states), states
        started = time.perf_counter()
        RESIDENCY.unload("bench/ip2p")
        RESIDENCY.pipeline(model, settings)
        switch_seconds = time.perf_counter() - started
    finally:
        await harness.client.aclose()
        await harness.state.db.dispose()
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
        "ready_with_preload_seconds": round(ready_seconds, 3),
        "model_switch_seconds": round(switch_seconds, 3),
        "overhead_ms_per_task": round(1000 * (service_seconds - direct_seconds) / args.tasks, 1),
    }


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
    parser.add_argument("--json", type=Path, help="also write the figures here")
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse()
    figures = asyncio.run(main(arguments))
    for name, value in figures.items():
        print(f"{name:32} {value}")
    if arguments.json:
        arguments.json.write_text(json.dumps(figures, indent=2))
