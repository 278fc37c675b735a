"""Dynamic batching: tasks/s by max batch size, and what a lone task pays for the wait.

Each case runs the real worker (claims, leases, engine thread, outputs, completions) in this
process on a fresh SQLite database, with the model's batching set through
``GENHOOK_MODEL_BATCHING``; tasks go in through the HTTP app (in-process ASGI).

- Throughput: ``--tasks`` tasks are submitted first, then one worker drains them; tasks/s
  from its start to the last completion, with ``max_batch_size`` 1, 4 and 8 side by side.
- Lone-task latency: one task a second (``--lone`` of them; for an engine slower than that,
  each once the last has ended) to an idle worker, from the submit's commit to the task's
  completion (both stamped by the database rows), with batch 1, batch 8 without a wait and
  batch 8 waiting up to ``--wait-ms``, side by side.

Cases (``--case``, repeatable):

- ``matmul``: ``test/matmul`` (``tests/support/engines.py``), a CPU stand-in for a forward
  pass whose weights (8 layers of 2048x2048 float32) are read once per call.
- ``stt``: ``genhook/speech-to-text``, the bundled tiny.en on the CPU, one spoken sentence
  per task (faster-whisper's ``BatchedInferencePipeline`` when batched).
- ``diffusers``: a local InstructPix2Pix model with random weights built in code: tiny on
  the CPU by default; ``--device cuda --real-size`` for Stable Diffusion 1.5's sizes in
  float16 on a GPU (``--steps`` denoising steps).
- ``--model ID --body JSON [--engines module:function]``: any other model whose engine
  implements ``run_batch`` (on a GPU machine, the same with a real pipeline size).

    .venv/bin/python benchmarks/batching.py                        # matmul and stt
    .venv/bin/python benchmarks/batching.py --case matmul --tasks 64 --lone 10

BLAS runs one thread (``OPENBLAS_NUM_THREADS=1`` unless set); torch, as in a worker, every
core the process may use. Each case first runs one unmeasured batch (the model's first calls).
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import base64
import contextlib
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# One BLAS thread for the matmul stand-in (before numpy loads): on a shared machine, threads
# spinning for cores they do not get cost more than the batch saves.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import httpx  # noqa: E402
from benchmarks._harness import median, percentile  # noqa: E402
from sqlalchemy import func, select  # noqa: E402

from genhook.accounts import create_account  # noqa: E402
from genhook.api import build_state, create_app  # noqa: E402
from genhook.config import Settings  # noqa: E402
from genhook.db import Task  # noqa: E402
from genhook.db.migrate import upgrade_in_thread  # noqa: E402
from genhook.engines.registry import build_registry  # noqa: E402
from genhook.sender.keys import load_encryption_key  # noqa: E402
from genhook.tasks.worker import Worker  # noqa: E402

BATCHES = (1, 4, 8)
TEST_ENGINES = "tests.support.engines:register_batching"


@dataclass
class Case:
    model: str
    # The request body of task ``i``, and the submit path.
    body: Any
    path: str = "generateImage"
    engines: list[str] = field(default_factory=list)
    note: str = ""
    # More settings of the service (a configured model, say).
    settings: dict[str, Any] = field(default_factory=dict)


def _png() -> str:
    from tests.support.images import data_url

    return data_url()


def matmul_case() -> Case:
    image = _png()
    return Case(
        "test/matmul",
        lambda i: {
            "model": "test/matmul",
            "prompt": f"p{i}",
            "images": [image],
            "size": "1024*1024",
        },
        engines=[TEST_ENGINES],
        note="CPU stand-in: 8 dense 2048x2048 layers, weights read once per call",
    )


def stt_case() -> Case:
    from tests.support.speech import SENTENCES

    from genhook.engines.audio._tts import TextToSpeechEngine
    from genhook.engines.base import EngineJob

    tts = TextToSpeechEngine(Settings(workers=1))
    tts.load()
    clips = []
    for text in SENTENCES[:8]:
        params = {"prompt": text, "voice": "en-us", "output_format": "wav", "sample_rate": 16000}
        data = tts.run(EngineJob("b", "genhook/text-to-speech", params, [])).outputs[0].data
        clips.append("data:audio/wav;base64," + base64.b64encode(data).decode())
    return Case(
        "genhook/speech-to-text",
        lambda i: {"model": "genhook/speech-to-text", "audio": clips[i % len(clips)]},
        path="generateAudio",
        note="tiny.en int8 on the CPU, one sentence (about 3 s) per task",
    )


def diffusers_case(weights: Path, device: str, real_size: bool, steps: int) -> Case:
    """A local InstructPix2Pix model with random weights, built in code (tiny, or at Stable
    Diffusion 1.5's sizes with ``real_size``); the target is batch 8 at least 2x batch 1."""
    import torch
    from tests.support.tiny_pipelines import build_once

    # The worker's own default, every core it may use: OMP_NUM_THREADS=1 above is for the
    # matmul stand-in's BLAS, and would leave torch one core of the machine's.
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    pipeline = "StableDiffusionInstructPix2PixPipeline"
    path = build_once(pipeline, weights, real_size=real_size)
    model = {
        "id": "local/pix2pix",
        "kind": "image",
        "pipeline": pipeline,
        "path": str(path),
        "device": device,
        "dtype": "float16" if real_size else "float32",
        "steps": steps,
        "generate_size": "512*512" if real_size else "32*32",
        "sizes": ["1024*1024"],
    }
    image = _png()
    return Case(
        "local/pix2pix",
        lambda i: {
            "model": "local/pix2pix",
            "prompt": f"make it red {i}",
            "images": [image],
            "size": "1024*1024",
            "seed": i,
        },
        note=f"InstructPix2Pix, random weights, {'SD-1.5 size, float16' if real_size else 'tiny'}"
        f", {steps} steps, on {device}",
        settings={"local_models": [model], "local_models_affinity_seconds": 0.0},
    )


async def _service(data_dir: Path, case: Case, size: int, wait_ms: int) -> tuple[Any, Any, Any]:
    settings = Settings(
        data_dir=data_dir,
        database_url=f"sqlite+aiosqlite:///{data_dir / 'genhook.db'}",
        public_base_url="http://bench",
        extra_engines=case.engines,
        model_batching={case.model: {"max_batch_size": size, "max_wait_ms": wait_ms}},
        workers=1,
        lease_seconds=60.0,
        task_deadline_seconds=3600.0,
        **case.settings,
    )
    data_dir.mkdir(parents=True, exist_ok=True)
    upgrade_in_thread(settings.resolved_database_url)
    state = build_state(settings, registry=build_registry(settings))
    account = await create_account(state.db, "bench", encryption_key=load_encryption_key(settings))
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(state)),
        base_url="http://bench",
        headers={"Authorization": f"Bearer {account.api_key}"},
        timeout=60,
    )
    return state, client, Worker.sharing(state, worker_id="bench")


async def _submit(client: Any, case: Case, index: int) -> str:
    response = await client.post(f"/api/v1/model/{case.path}", json=case.body(index))
    response.raise_for_status()
    task_id: str = response.json()["id"]
    return task_id


async def _finished(state: Any, ids: list[str]) -> list[Task]:
    async with state.db.read() as session:
        return list((await session.scalars(select(Task).where(Task.id.in_(ids)))).all())


POLL_SECONDS = 0.02


async def _until_done(state: Any, ids: list[str], timeout: float) -> list[Task]:
    """Polls a count, every 20 ms: a poll that loads the tasks costs milliseconds of the
    event loop's time, which the engine's thread then waits for (the GIL), and would be
    charged to the batch being measured. The times measured are the tasks' own."""
    done = select(func.count()).where(Task.id.in_(ids), Task.finished_at.is_not(None))
    async with asyncio.timeout(timeout):
        while True:
            async with state.db.read() as session:
                if await session.scalar(done) == len(ids):
                    return await _finished(state, ids)
            await asyncio.sleep(POLL_SECONDS)


async def throughput(case: Case, size: int, count: int, root: Path) -> dict[str, Any]:
    state, client, worker = await _service(root / f"t{size}", case, size, 0)
    try:
        ids = [await _submit(client, case, i) for i in range(count)]
        await worker.load_engine(case.model)  # loading is not the batch's cost
        stop = asyncio.Event()
        started = time.time()
        running = asyncio.create_task(worker.run(stop))
        try:
            tasks = await _until_done(state, ids, 3600)
            elapsed = max(task.finished_at or 0 for task in tasks) / 1000 - started
        finally:
            stop.set()
            await running
        statuses = {task.status for task in tasks}
        sizes = [int(task.info.get("batch_size", 1)) for task in tasks]
        return {
            "max_batch_size": size,
            "tasks": count,
            "seconds": round(elapsed, 3),
            "tasks_per_s": round(count / elapsed, 2),
            "mean_batch": round(sum(sizes) / len(sizes), 2),
            "statuses": sorted(statuses),
        }
    finally:
        await client.aclose()
        await state.db.dispose()


async def lone_latency(
    case: Case, configs: list[tuple[int, int]], count: int, root: Path
) -> list[dict[str, Any]]:
    """One task a second to each idle worker of ``configs`` (max batch size, max wait), side
    by side (their submits take turns, each after the last task ended), so all see the
    same load and every task finds its worker idle."""
    services = [
        await _service(root / f"l{size}-{wait}", case, size, wait) for size, wait in configs
    ]
    gap = 1.0 / len(services)
    stop = asyncio.Event()
    running = []
    ids: list[list[str]] = [[] for _ in services]
    try:
        for _, _, worker in services:
            await worker.load_engine(case.model)
            running.append(asyncio.create_task(worker.run(stop)))
        await asyncio.sleep(0.5)  # the workers are idle, waiting for a wake-up
        for i in range(count):
            for index, (state, client, _) in enumerate(services):
                sent = time.monotonic()
                ids[index].append(await _submit(client, case, i))
                # Alone: the next task goes once this one has ended, at most one a second.
                await _until_done(state, ids[index][-1:], 600)
                await asyncio.sleep(max(0.0, gap - (time.monotonic() - sent)))
        rows = []
        for (size, wait), (state, _, _), mine in zip(configs, services, ids, strict=True):
            tasks = await _until_done(state, mine, 600)
            latencies = [float((t.finished_at or 0) - t.created_at) for t in tasks]
            rows.append(
                {
                    "max_batch_size": size,
                    "max_wait_ms": wait,
                    "tasks": count,
                    "p50_ms": round(median(latencies), 1),
                    "p90_ms": round(percentile(latencies, 90), 1),
                }
            )
        return rows
    finally:
        stop.set()
        await asyncio.gather(*running)
        for state, client, _ in services:
            await client.aclose()
            await state.db.dispose()


async def run_case(name: str, case: Case, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    print(f"== {name}: {case.model} ({case.note})", flush=True)
    runs: dict[int, list[dict[str, Any]]] = {size: [] for size in BATCHES}
    # Unmeasured: the model's first calls (kernels, allocator, lazy imports) are no size's cost.
    await throughput(case, max(BATCHES), max(BATCHES), root / name / "warm-up")
    for round_ in range(args.rounds):  # interleaved, so a load spike hits every size alike
        for size in BATCHES:
            row = await throughput(case, size, args.tasks, root / name / f"r{round_}")
            print(f"  batch {size}: {row}", flush=True)
            runs[size].append(row)
    rows = []
    for size in BATCHES:
        rates = [row["tasks_per_s"] for row in runs[size]]
        rows.append({"max_batch_size": size, "tasks_per_s": round(median(rates), 2), "runs": rates})
    base = rows[0]["tasks_per_s"]
    for row in rows:
        row["speedup"] = round(row["tasks_per_s"] / base, 2) if base else math.nan
    lone = await lone_latency(case, [(1, 0), (8, 0), (8, args.wait_ms)], args.lone, root / name)
    for row in lone:
        print(f"  lone task: {row}", flush=True)
    extra = lone[2]["p50_ms"] - lone[0]["p50_ms"]
    print(
        f"  median tasks/s: {[(r['max_batch_size'], r['tasks_per_s']) for r in rows]}; batch 8 "
        f"is {rows[-1]['speedup']}x batch 1. A lone task's p50 with batch 8: {extra:+.1f} ms "
        f"over batch 1 (target at most {args.wait_ms} + 5 ms)",
        flush=True,
    )
    return {"model": case.model, "note": case.note, "throughput": rows, "lone": lone}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--case", action="append", choices=["matmul", "stt", "diffusers"])
    parser.add_argument("--model", help="any other batched model (with --body)")
    parser.add_argument("--body", help="its request body, JSON; {i} is the task's number")
    parser.add_argument("--path", default="generateImage")
    parser.add_argument("--engines", action="append", default=[])
    parser.add_argument("--tasks", type=int, default=32, help="tasks per throughput run")
    parser.add_argument("--stt-tasks", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2, help="throughput runs per size")
    parser.add_argument("--lone", type=int, default=10, help="lone tasks, one a second")
    parser.add_argument("--wait-ms", type=int, default=20)
    parser.add_argument("--device", default="cpu", help="the diffusers case's device")
    parser.add_argument("--real-size", action="store_true", help="diffusers: SD-1.5 sized")
    parser.add_argument("--steps", type=int, default=4, help="diffusers: denoising steps")
    parser.add_argument(
        "--weights", type=Path, help="diffusers: build here, or reuse what is built here (kept)"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    cases: dict[str, Case] = {}
    for name in args.case or ([] if args.model else ["matmul", "stt"]):
        if name == "matmul":
            cases[name] = matmul_case()
        elif name == "stt":
            cases[name] = stt_case()
        else:
            weights = args.weights
            if weights is None:
                weights = Path(tempfile.mkdtemp(prefix="genhook-batching-weights-"))
                atexit.register(shutil.rmtree, weights, True)
            cases[name] = diffusers_case(weights, args.device, args.real_size, args.steps)
    if args.model:
        template = args.body or "{}"
        cases[args.model] = Case(
            args.model,
            lambda i: json.loads(template.replace("{i}", str(i))),
            path=args.path,
            engines=args.engines,
        )
    print(f"load: {os.getloadavg()}", flush=True)
    results = {}
    with tempfile.TemporaryDirectory(prefix="genhook-batching-") as tmp:
        for name, case in cases.items():
            saved = args.tasks
            if name == "stt":
                args.tasks = args.stt_tasks
            results[name] = asyncio.run(run_case(name, case, args, Path(tmp)))
            args.tasks = saved
    print(f"load: {os.getloadavg()}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    with contextlib.suppress(Exception):
        sys.stdout.flush()


if __name__ == "__main__":
    main()
