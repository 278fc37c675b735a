"""Benchmark of the built-in video model (``genhook/image-to-video``).

Speed: output frames per second of ``ImageToVideoEngine.run`` for a 5 s, 30 fps clip from
one 16:9 photo ("slowly zoom in, add a vignette"), everything included: decoding, the NSFW
check of the input, frames, H.264 encoding with +faststart and the NSFW flag of sampled
frames; at 480p, 720p and 1080p, on one worker and with two worker processes at once (spawn,
one engine per process as the service runs it). Memory: the peak RSS of a worker process
that makes a 30 s 1080p video.

    .venv/bin/python benchmarks/video.py
    .venv/bin/python benchmarks/video.py --runs 3 --jobs 4 --json out.json
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing as mp
import os
import resource
import statistics
import time
from multiprocessing.queues import Queue
from typing import Any

from PIL import Image

from genhook.config import Settings
from genhook.engines.base import EngineJob
from genhook.engines.image_to_video._engine import ImageToVideoEngine

PROMPT = "slowly zoom in, add a vignette"
RESOLUTIONS = ("480p", "720p", "1080p")
SECONDS = 5
FPS = 30


def input_jpeg() -> bytes:
    """Grace Hopper's portrait from matplotlib's wheel, padded out to a 1600×900 photo."""
    import matplotlib.cbook

    path = matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    portrait = Image.open(path).convert("RGB").resize((800, 900), Image.Resampling.LANCZOS)
    image = Image.new("RGB", (1600, 900), (70, 90, 120))
    image.paste(portrait, (400, 0))
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def job(data: bytes, resolution: str, seconds: int, index: int = 0) -> EngineJob:
    params = {
        "prompt": PROMPT,
        "duration": seconds,
        "resolution": resolution,
        "aspect_ratio": "16:9",
        "fps": FPS,
    }
    return EngineJob(
        task_id=f"bench-{index}", model="genhook/image-to-video", params=params, images=[data]
    )


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _worker(resolution: str, count: int, start: Any, results: Queue[float]) -> None:
    engine = ImageToVideoEngine(Settings())
    engine.load()
    data = input_jpeg()
    start.wait()
    for index in range(count):
        began = time.perf_counter()
        engine.run(job(data, resolution, SECONDS, index))
        results.put(time.perf_counter() - began)


def parallel(resolution: str, workers: int, jobs: int) -> float:
    """Output frames per second of ``workers`` processes sharing ``jobs`` clips."""
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    results: Queue[float] = ctx.Queue()
    per = [jobs // workers + (1 if i < jobs % workers else 0) for i in range(workers)]
    procs = [ctx.Process(target=_worker, args=(resolution, n, start, results)) for n in per]
    for proc in procs:
        proc.start()
    time.sleep(3.0)  # every process has loaded its engine
    began = time.perf_counter()
    start.set()
    for _ in range(jobs):
        results.get(timeout=600)
    elapsed = time.perf_counter() - began
    for proc in procs:
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
    return jobs * SECONDS * FPS / elapsed


def _peak(resolution: str, seconds: int, out: Queue[dict[str, float]]) -> None:
    engine = ImageToVideoEngine(Settings())
    engine.load()
    data = input_jpeg()
    loaded = rss_mb()
    began = time.perf_counter()
    result = engine.run(job(data, resolution, seconds))
    out.put(
        {
            "loaded_mb": loaded,
            "peak_mb": rss_mb(),
            "seconds": time.perf_counter() - began,
            "output_mb": len(result.outputs[0].data) / 1e6,
        }
    )


def peak_rss(resolution: str, seconds: int) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    out: Queue[dict[str, float]] = ctx.Queue()
    proc = ctx.Process(target=_peak, args=(resolution, seconds, out))
    proc.start()
    try:
        return out.get(timeout=600)
    finally:
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=2, help="single-worker runs per resolution")
    parser.add_argument("--jobs", type=int, default=4, help="clips per two-worker measurement")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--single-only", action="store_true", help="skip the other parts")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}")
    engine = ImageToVideoEngine(Settings())
    engine.load()
    data = input_jpeg()
    engine.run(job(data, "480p", 1))  # warm up
    figures: dict[str, Any] = {"single": {}, "two_workers": {}}
    frames = SECONDS * FPS
    print(f"{SECONDS} s at {FPS} fps ({frames} frames), one worker:")
    for resolution in RESOLUTIONS:
        times, cpu_times = [], []
        for index in range(args.runs):
            began, began_cpu = time.perf_counter(), time.process_time()
            engine.run(job(data, resolution, SECONDS, index))
            times.append(time.perf_counter() - began)
            cpu_times.append(time.process_time() - began_cpu)
        wall, cpu = statistics.median(times), statistics.median(cpu_times)
        figures["single"][resolution] = {"wall_s": wall, "cpu_s": cpu, "fps": frames / wall}
        # CPU time is what the clip costs one core; on an idle core the wall time matches it.
        print(
            f"  {resolution:>5}: {wall:5.2f} s wall, {frames / wall:6.1f} frames/s, "
            f"{SECONDS / wall:4.1f}x real time; {cpu:5.2f} s CPU "
            f"({frames / cpu:6.1f} frames per CPU second)"
        )
    if args.single_only:
        return
    print(f"two worker processes, {args.jobs} clips:")
    for resolution in RESOLUTIONS:
        fps = parallel(resolution, 2, args.jobs)
        figures["two_workers"][resolution] = {"fps": fps}
        print(f"  {resolution:>5}: {fps:6.1f} frames/s in all, {fps / FPS:4.1f}x real time")
    peak = peak_rss("1080p", 30)
    figures["peak_30s_1080p"] = peak
    print(
        f"30 s 1080p in one worker: peak RSS {peak['peak_mb']:.0f} MB "
        f"({peak['loaded_mb']:.0f} MB after loading), {peak['seconds']:.1f} s, "
        f"{peak['output_mb']:.1f} MB MP4"
    )
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(figures, handle, indent=2)


if __name__ == "__main__":
    main()
