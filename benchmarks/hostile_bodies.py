"""``/healthz`` latency and API memory while worst-case request bodies arrive back to back.

Starts ``genhook serve`` (SQLite, no workers, default limits: a 64 MiB body cap) and runs,
for ``--seconds``, ``--attackers`` connections each sending the bodies below one after the
other, while a prober asks ``/healthz`` every 10 ms on its own connection. Prints the
probe latencies, what each body was answered, and the API process's peak memory (VmHWM).

    .venv/bin/python benchmarks/hostile_bodies.py [--seconds 20] [--attackers 2]

Bodies: 60 MB of empty arrays, 50 MB of small objects, 60 MB of nesting, a 60 MB data URL
of noise (decoded, then refused as no image) and a 40 MB data URL of a PNG (accepted: a task
and its input are written).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._harness import (  # noqa: E402
    api_process,
    free_port,
    percentile,
    stop_process,
    wait_ready,
)

MB = 1_000_000


def bodies() -> dict[str, bytes]:
    noise = base64.b64encode(os.urandom(45 * MB)).decode()
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + os.urandom(30 * MB)).decode()

    def request(image: str) -> bytes:
        return json.dumps(
            {
                "model": "genhook/image-edit",
                "prompt": "black and white",
                "size": "1024*1024",
                "images": [image],
            }
        ).encode()

    return {
        "empty arrays 60 MB": b"[" + b"[]," * (20 * MB) + b"[]]",
        "small objects 50 MB": b"[" + b'{"a":1},' * (50 * MB // 8) + b"{}]",
        "nesting 60 MB": b"[" * (30 * MB) + b"]" * (30 * MB),
        "noise data URL 60 MB": request("data:image/png;base64," + noise),
        "PNG data URL 40 MB": request("data:image/png;base64," + png),
    }


def send(port: int, key: str, body: bytes) -> int:
    head = (
        "POST /api/v1/model/generateImage HTTP/1.1\r\nHost: bench\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(head)
        # Refused before the whole body was read: the answer is waiting.
        with contextlib.suppress(OSError):
            sock.sendall(body)
        answer = b""
        while b"\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    parts = answer.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--attackers", type=int, default=2)
    parser.add_argument("--only", default="", help="only the bodies whose name contains this")
    args = parser.parse_args()

    print("preparing bodies ...", flush=True)
    cases = {name: body for name, body in bodies().items() if args.only in name}
    data_dir = Path(tempfile.mkdtemp(prefix="genhook-hostile-"))
    port = free_port()
    env = {
        **os.environ,
        "GENHOOK_DATA_DIR": str(data_dir),
        "GENHOOK_PORT": str(port),
        "GENHOOK_WORKERS": "0",
        "GENHOOK_LOG_LEVEL": "WARNING",
    }
    with open(data_dir / "service.log", "wb") as log:
        service = subprocess.Popen(
            [sys.executable, "-m", "genhook.cli", "serve"], env=env, stdout=log, stderr=log
        )
    try:
        wait_ready(f"http://127.0.0.1:{port}/readyz")
        key = json.loads((data_dir / "credentials.json").read_text())["api_key"]
        api = api_process(service.pid)  # serve's child that answers HTTP, not the supervisor
        baseline = peak_rss(api)
        stop = threading.Event()
        answers: Counter[tuple[str, int]] = Counter()
        latencies: list[float] = []
        failures: list[str] = []

        def attack() -> None:
            names = list(cases)
            index = 0
            while not stop.is_set():
                name = names[index % len(names)]
                index += 1
                try:
                    answers[(name, send(port, key, cases[name]))] += 1
                except OSError as exc:
                    answers[(name, -1)] += 1
                    failures.append(f"{name}: {exc!r}")

        def probe() -> None:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
                while not stop.is_set():
                    started = time.perf_counter()
                    try:
                        if client.get("/healthz").status_code != 200:
                            failures.append("healthz not 200")
                    except httpx.HTTPError as exc:
                        failures.append(f"healthz: {exc!r}")
                    latencies.append(time.perf_counter() - started)
                    time.sleep(0.01)

        threads = [threading.Thread(target=probe)]
        threads += [threading.Thread(target=attack) for _ in range(args.attackers)]
        for thread in threads:
            thread.start()
        time.sleep(args.seconds)
        stop.set()
        for thread in threads:
            thread.join(180)
        load = Path("/proc/loadavg").read_text().split()[:3]
        print(f"load average during the run: {' '.join(load)} ({os.cpu_count()} CPUs)")
        print(f"{args.attackers} attackers for {args.seconds:g} s; answers:")
        for (name, status), count in sorted(answers.items()):
            print(f"  {name:<24} HTTP {status}: {count}")
        ms = [x * 1000 for x in latencies]
        print(
            f"/healthz: {len(ms)} probes, p50 {percentile(ms, 50):.1f} ms, "
            f"p99 {percentile(ms, 99):.1f} ms, max {max(ms):.1f} ms"
        )
        print(
            f"API process peak RSS: {peak_rss(api) / 2**20:.0f} MiB "
            f"(after start: {baseline / 2**20:.0f} MiB)"
        )
        if failures:
            print(f"{len(failures)} failures, first: {failures[0]}")
    finally:
        stop_process(service)
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
