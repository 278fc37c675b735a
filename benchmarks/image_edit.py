"""Benchmark of the built-in image-edit engine.

Per operation: median and p95 wall time of ``ImageEditEngine.run`` for a 1024×1024 JPEG
input (a portrait, so face and background operations have a subject) to a 2048*2048 JPEG
output, everything included: decoding, NSFW check of the input, the edit, the fit, the
NSFW flag of the output and encoding. Throughput: the same job list run by 1 and by 2
worker processes (multiprocessing, spawn, one engine per process as the service runs it).

Style transfer: median and p95 of the same full run for a named look ("in the style of a
mosaic") and for another input's look ("in the style of the second image"), to a 1024*1024
and a 2048*2048 output from an input of that size, so the network runs at full size. One
worker: the engine's ONNX sessions use the cores ``genhook serve`` gives each worker.

    .venv/bin/python benchmarks/image_edit.py            # everything, standard mode
    .venv/bin/python benchmarks/image_edit.py --runs 5 --jobs 40 --mode fast --json out.json
    .venv/bin/python benchmarks/image_edit.py --skip-operations --skip-throughput --style-runs 5
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from genhook.config import Settings
from genhook.engines.base import EngineJob
from genhook.engines.image_edit import ImageEditEngine
from genhook.engines.onnx import shared_threads

PIXEL_OPS: dict[str, str] = {
    "grayscale": "make it black and white",
    "sepia": "sepia",
    "invert": "invert the colors",
    "brightness": "increase brightness by 20%",
    "contrast": "increase contrast by 20%",
    "saturation": "boost saturation by 30%",
    "sharpness": "reduce sharpness by 30%",
    "blur": "blur it",
    "sharpen": "sharpen",
    "rotate": "rotate 30 degrees",
    "flip": "flip horizontally",
    "crop": "crop to 16:9",
    "pixelate": "pixelate",
    "posterize": "posterize to 4 levels",
    "edges": "detect edges",
    "sketch": "pencil sketch",
    "cartoon": "make it look like a cartoon",
    "painting": "make it look like a painting",
    "vignette": "add a vignette",
    "border": "add a 40px gold border",
    "caption": 'add the caption "genhook" at the bottom in white',
}
DETECTOR_OPS: dict[str, str] = {
    "blur_faces": "blur the faces",
    "pixelate_faces": "pixelate the faces",
    "remove_background": "remove the background",
    "blur_background": "blur the background",
    "color_background": "make the background light blue",
}


def input_jpeg() -> bytes:
    """Grace Hopper's portrait from matplotlib's wheel, cover-fitted to 1024×1024."""
    import matplotlib.cbook

    path = matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    image = Image.open(path).convert("RGB")
    side = min(image.size)
    image = image.crop((0, 0, side, side)).resize((1024, 1024), Image.Resampling.LANCZOS)
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def job(prompt: str, data: bytes, mode: str, index: int = 0) -> EngineJob:
    params = {
        "model": "genhook/image-edit",
        "prompt": prompt,
        "size": "2048*2048",
        "output_format": "jpeg",
        "thinking": "enabled",
        "prompt_optimization_mode": mode,
        "enable_base64_output": False,
    }
    return EngineJob(f"bench-{index}", "genhook/image-edit", params, [data])


STYLE_PROMPTS: dict[str, str] = {
    "named (mosaic)": "in the style of a mosaic",
    "second image": "in the style of the second image",
}


def style_inputs(side: int) -> tuple[bytes, bytes]:
    """The portrait at ``side`` square, and a style picture: bold diagonal stripes."""
    portrait = Image.open(io.BytesIO(input_jpeg())).resize((side, side), Image.Resampling.LANCZOS)
    stripes = Image.new("RGB", (512, 512), (250, 140, 20))
    draw = ImageDraw.Draw(stripes)
    for offset in range(-512, 512, 40):
        draw.polygon(
            [(offset, 0), (offset + 20, 0), (offset + 532, 512), (offset + 512, 512)],
            fill=(20, 40, 200),
        )
    encoded = []
    for image in (portrait, stripes):
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=90)
        encoded.append(buffer.getvalue())
    return encoded[0], encoded[1]


def style_transfer(runs: int, mode: str) -> dict[str, dict[str, float]]:
    settings = Settings()
    engine = ImageEditEngine(settings)
    engine.load()
    figures: dict[str, dict[str, float]] = {}
    for side in (1024, 2048):
        photo, style = style_inputs(side)
        for name, prompt in STYLE_PROMPTS.items():
            task = job(prompt, photo, mode)
            task.params["size"] = f"{side}*{side}"
            if "second" in prompt:
                task.images.append(style)
            engine.run(task)  # warm-up: loads the networks
            times, cpu = [], []
            for _ in range(runs):
                start, cpu_start = time.perf_counter(), time.process_time()
                result = engine.run(task)
                times.append((time.perf_counter() - start) * 1000)
                cpu.append((time.process_time() - cpu_start) * 1000)
            assert result.info["size"] == f"{side}*{side}"
            key = f"{side}*{side} {name}"
            # CPU time stands for the wall time of an idle core when the machine is busy.
            figures[key] = {
                "median_ms": statistics.median(times),
                "p95_ms": percentile(times, 0.95),
                "median_cpu_ms": statistics.median(cpu),
            }
            print(
                f"  {key:28s} median {figures[key]['median_ms']:8.1f} ms"
                f"   p95 {figures[key]['p95_ms']:8.1f} ms"
                f"   CPU median {figures[key]['median_cpu_ms']:8.1f} ms"
                f"   load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    return figures


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    rank = fraction * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def per_operation(runs: int, mode: str, data: bytes) -> dict[str, dict[str, float]]:
    engine = ImageEditEngine(Settings())
    engine.load()
    figures: dict[str, dict[str, float]] = {}
    for kind, table in (("pixel", PIXEL_OPS), ("detector", DETECTOR_OPS)):
        for name, prompt in table.items():
            task = job(prompt, data, mode)
            engine.run(task)  # warm-up
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                engine.run(task)
                times.append((time.perf_counter() - start) * 1000)
            figures[name] = {
                "kind": kind,  # type: ignore[dict-item]
                "median_ms": statistics.median(times),
                "p95_ms": percentile(times, 0.95),
            }
            print(
                f"  {name:18s} {kind:8s} median {figures[name]['median_ms']:7.1f} ms"
                f"   p95 {figures[name]['p95_ms']:7.1f} ms",
                flush=True,
            )
    return figures


def _worker(jobs: Queue[EngineJob | None], ready: Queue[float], go: Event, warm: EngineJob) -> None:
    engine = ImageEditEngine(Settings())
    engine.load()
    engine.run(warm)
    ready.put(0.0)
    go.wait()
    before = time.process_time()
    done = 0
    while (task := jobs.get()) is not None:
        engine.run(task)
        done += 1
    ready.put(time.process_time() - before)


def throughput(processes: int, tasks: list[EngineJob]) -> tuple[float, float]:
    """Return (tasks per second, CPU seconds per task). CPU per task staying flat from 1 to
    2 workers while tasks/s does not double points at the machine, not at the engine."""
    ctx = mp.get_context("spawn")
    jobs: Queue[EngineJob | None] = ctx.Queue()
    ready: Queue[float] = ctx.Queue()
    go = ctx.Event()
    for task in tasks:
        jobs.put(task)
    for _ in range(processes):
        jobs.put(None)
    workers = [
        ctx.Process(target=_worker, args=(jobs, ready, go, tasks[0])) for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    for _ in range(processes):
        ready.get(timeout=300)
    start = time.perf_counter()
    go.set()
    cpu = sum(ready.get(timeout=900) for _ in range(processes))
    elapsed = time.perf_counter() - start
    for worker in workers:
        worker.join()
    if any(worker.exitcode != 0 for worker in workers):
        raise SystemExit("a benchmark worker failed")
    return len(tasks) / elapsed, cpu / len(tasks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=15, help="timed runs per operation")
    parser.add_argument("--jobs", type=int, default=48, help="tasks in the throughput job list")
    parser.add_argument("--mode", choices=["standard", "fast"], default="standard")
    parser.add_argument("--skip-operations", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--style-runs", type=int, default=5, help="timed runs per style case")
    parser.add_argument("--skip-styles", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)

    data = input_jpeg()
    report: dict[str, Any] = {
        "input": "1024x1024 JPEG",
        "output": "2048*2048 JPEG",
        "mode": args.mode,
        "cpus": mp.cpu_count(),
        "load_average_at_start": os.getloadavg()[0],
    }
    if not args.skip_operations:
        print(f"per operation ({args.runs} runs each, {args.mode} mode):", flush=True)
        ops = per_operation(args.runs, args.mode, data)
        report["operations"] = ops
        pixel = [v["median_ms"] for v in ops.values() if v["kind"] == "pixel"]
        detector = [v["median_ms"] for v in ops.values() if v["kind"] == "detector"]
        report["pixel_median_of_medians_ms"] = statistics.median(pixel)
        report["pixel_worst_median_ms"] = max(pixel)
        report["detector_worst_median_ms"] = max(detector)
        print(
            f"pixel operations: median of medians {statistics.median(pixel):.1f} ms, "
            f"worst median {max(pixel):.1f} ms; face/background worst median "
            f"{max(detector):.1f} ms"
        )
    if not args.skip_styles:
        print(
            f"style transfer ({args.style_runs} runs each, one worker, "
            f"{shared_threads(Settings())} ONNX Runtime thread(s)):",
            flush=True,
        )
        report["style_transfer"] = style_transfer(args.style_runs, args.mode)
    if not args.skip_throughput:
        prompts = list(PIXEL_OPS.values()) + list(DETECTOR_OPS.values())
        tasks = [job(prompts[i % len(prompts)], data, args.mode, i) for i in range(args.jobs)]
        one, cpu_one = throughput(1, tasks)
        two, cpu_two = throughput(2, tasks)
        report["tasks_per_second"] = {"1": one, "2": two, "scaling": two / one}
        report["cpu_ms_per_task"] = {"1": cpu_one * 1000, "2": cpu_two * 1000}
        print(
            f"throughput over {len(tasks)} mixed tasks: 1 worker {one:.2f} tasks/s, "
            f"2 workers {two:.2f} tasks/s, scaling {two / one:.2f}x; CPU per task "
            f"{cpu_one * 1000:.0f} ms with 1 worker, {cpu_two * 1000:.0f} ms with 2"
        )
    print(f"load average when the run started: {report['load_average_at_start']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
