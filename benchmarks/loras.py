"""Benchmark of LoRA switching on a local model: tasks alternating among 4 adapters against
the same tasks with none, in one run.

A tiny random-weight Stable Diffusion XL pipeline (``--device cuda --real-size`` is not
offered: the tiny one isolates the switching, which is per call, from the denoising) with 4
random adapters made with PEFT, run through the engine as the worker runs it: each task is
decoded, sent to the model process, which activates the task's adapter with
``set_adapters`` (loading it the first time), calls the pipeline, and the picture comes back
to be checked and encoded. Three sides take turns each round (a shared machine's speed
drifts, and the drift falls on all alike): no adapter; one adapter on every task (what an
adapter's own layers cost); a different adapter on each task in turn (that, plus a switch
on every call). Prints tasks/s of each, and the alternating side's share of the plain one.

    .venv/bin/python benchmarks/loras.py                 # tiny pipeline, CPU
    .venv/bin/python benchmarks/loras.py --device cuda --tasks 16 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MODEL = "bench/sdxl"
PIPELINE = "StableDiffusionXLPipeline"
ADAPTERS = ["a", "b", "c", "d"]


def main(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="genhook-bench-loras-"))
    try:
        return measure(args, root)
    finally:  # the model process, a daemon child, ends with this one
        shutil.rmtree(root, ignore_errors=True)


def measure(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from tests.support.tiny_loras import random_loras, residency_counts
    from tests.support.tiny_pipelines import build_once

    from genhook.config import Settings
    from genhook.engines.base import EngineJob
    from genhook.engines.local._config import LocalModel
    from genhook.engines.local._engine import DiffusersEngine
    from genhook.engines.local._host import HOST

    weights = build_once(PIPELINE, args.weights or root / "weights")
    folders = random_loras(weights, PIPELINE, [root / name for name in ADAPTERS])
    entry = {
        "id": MODEL,
        "kind": "image",
        "pipeline": PIPELINE,
        "path": str(weights),
        "device": args.device,
        "dtype": "float32",
        "steps": args.steps,
        "generate_size": "32*32",
        "sizes": ["1024*1024"],
        "loras": {
            name: {"path": str(folder)} for name, folder in zip(ADAPTERS, folders, strict=True)
        },
    }
    settings = Settings(
        local_models=[entry],
        local_models_cpu_threads=args.threads,
        data_dir=root / "data",
    )
    engine = DiffusersEngine(LocalModel.model_validate(entry), settings)
    engine.load()

    def run(loras: list[list[dict[str, Any]]]) -> float:
        started = time.perf_counter()
        for number, chosen in enumerate(loras):
            params = {"prompt": "a red square", "size": "1024*1024", "seed": number}
            params.update(output_format="jpeg", loras=chosen)
            engine.run(EngineJob(f"bench-{number}", MODEL, params, []))
        return time.perf_counter() - started

    plain: list[list[dict[str, Any]]] = [[] for _ in range(args.tasks)]
    one = [[{"name": ADAPTERS[0]}] for _ in range(args.tasks)]
    turns = [[{"name": ADAPTERS[n % len(ADAPTERS)]}] for n in range(args.tasks)]
    run(plain[:1])  # warm-ups: the first call, and each adapter's first load
    run([[{"name": name}] for name in ADAPTERS])
    rounds: list[tuple[float, float, float]] = []
    for _ in range(args.rounds):
        rounds.append((run(plain), run(one), run(turns)))
    loads, unloads = HOST.run(residency_counts)
    total = args.tasks * args.rounds
    plain_rate = total / sum(r[0] for r in rounds)
    one_rate = total / sum(r[1] for r in rounds)
    turns_rate = total / sum(r[2] for r in rounds)
    return {
        "device": args.device,
        "steps": args.steps,
        "tasks": f"{args.rounds} rounds of {args.tasks} on each side",
        "threads": args.threads or "default",
        "plain_tasks_per_second": round(plain_rate, 3),
        "one_adapter_tasks_per_second": round(one_rate, 3),
        "alternating_4_tasks_per_second": round(turns_rate, 3),
        "alternating_share_of_plain": round(turns_rate / plain_rate, 3),
        "alternating_share_of_one_adapter": round(turns_rate / one_rate, 3),
        "share_each_round": [round(r[0] / r[2], 3) for r in rounds],
        "plain_ms_per_task": round(1000 * sum(r[0] for r in rounds) / total, 1),
        "alternating_ms_per_task": round(1000 * sum(r[2] for r in rounds) / total, 1),
        "model_loads": loads,
        "model_unloads": unloads,
    }


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--tasks", type=int, default=8, help="tasks a round, on each side")
    parser.add_argument("--rounds", type=int, default=3, help="turns of the three sides")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument(
        "--threads", type=int, default=1, help="CPU threads of the calls (0: the process share)"
    )
    parser.add_argument("--weights", type=Path, help="build the pipeline here, or reuse it")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse()
    print(f"load: {os.getloadavg()}", flush=True)
    figures = main(arguments)
    for name, value in figures.items():
        print(f"{name:36} {value}")
    print(f"load: {os.getloadavg()}", flush=True)
    if arguments.json:
        arguments.json.write_text(json.dumps(figures, indent=2))
