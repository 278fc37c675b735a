"""Serving a large output from each blob store: whole downloads, 1 MiB Range requests (as a
video player seeks), the redirect answer, and what the API process's memory does meanwhile.

Starts moto's S3 server on loopback and ``genhook serve`` (API only, SQLite) once per store:
files in the data directory, a bucket streamed through the API, a bucket with redirects. The
bucket is moto (Python, in memory), so its figures bound what genhook's own path costs from
above rather than measure a real S3.

    .venv/bin/python benchmarks/blob_store.py [--mib 64] [--ranges 40]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._harness import (  # noqa: E402
    api_process,
    child_pythonpath,
    free_port,
    median,
    percentile,
    stop_process,
    wait_ready,
)
from tests.support.s3 import S3_ENV, S3Server, s3_client, start_s3  # noqa: E402


def rss_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(name: str, env: dict[str, str], place: object, size: int, ranges: int) -> None:
    data_dir = tempfile.mkdtemp(prefix="genhook-bench-blobs-")
    port = free_port()
    full_env = {
        **os.environ,
        **S3_ENV,
        "GENHOOK_DATA_DIR": data_dir,
        "GENHOOK_PORT": str(port),
        "GENHOOK_WORKERS": "0",
        "GENHOOK_LOG_LEVEL": "WARNING",
        "PYTHONPATH": child_pythonpath(),
        **env,
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "genhook.cli", "serve"],
        env=full_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(base + "/readyz")
        api = api_process(server.pid)  # serve's child that answers HTTP holds the memory
        key = f"outputs/{secrets.token_urlsafe(24)}.mp4"
        assert callable(place)
        place(Path(data_dir), key)
        url = f"{base}/api/v1/outputs/{key}"
        with httpx.Client(timeout=120) as client:
            client.get(url, headers={"Range": "bytes=0-0"}, follow_redirects=True)
            before = rss_mib(api, "VmRSS")
            whole: list[float] = []
            for _ in range(3):
                started = time.perf_counter()
                got = 0
                with client.stream("GET", url, follow_redirects=True) as response:
                    assert response.status_code == 200, response.status_code
                    for chunk in response.iter_bytes():
                        got += len(chunk)
                whole.append(time.perf_counter() - started)
                assert got == size, got
            seeks: list[float] = []
            first_answer: list[float] = []
            for _ in range(ranges):
                first = random.randrange(0, size - (1 << 20))
                header = {"Range": f"bytes={first}-{first + (1 << 20) - 1}"}
                started = time.perf_counter()
                response = client.get(url, headers=header)
                first_answer.append(time.perf_counter() - started)
                if response.status_code == 307:
                    response = client.get(response.headers["location"], headers=header)
                assert response.status_code == 206 and len(response.content) == 1 << 20
                seeks.append(time.perf_counter() - started)
            peak = rss_mib(api, "VmHWM")
        mib_s = size / (1 << 20) / median(whole)
        print(
            f"{name:<16} whole {mib_s:7.0f} MiB/s   1 MiB range p50 "
            f"{median(seeks) * 1000:6.1f} ms p99 {percentile(seeks, 99) * 1000:6.1f} ms   "
            f"API answer p50 {median(first_answer) * 1000:6.1f} ms   "
            f"API RSS {before:5.0f} MiB before, peak {peak:5.0f} MiB"
        )
    finally:
        stop_process(server)
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64, help="size of the output")
    parser.add_argument("--ranges", type=int, default=40, help="Range requests per store")
    args = parser.parse_args()
    size = args.mib << 20
    payload = os.urandom(size)
    s3: S3Server = start_s3()
    try:
        bucket = s3.new_bucket()

        def to_file(data_dir: Path, key: str) -> None:
            path = data_dir / "blobs" / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(payload)

        def to_bucket(_: Path, key: str) -> None:
            s3_client(s3.endpoint_url).put_object(
                Bucket=bucket, Key=f"bench/{key}", Body=payload, ContentType="video/mp4"
            )

        bucket_env = {
            "GENHOOK_BLOB_STORE": f"s3://{bucket}/bench",
            "GENHOOK_S3_ENDPOINT_URL": s3.endpoint_url,
            "GENHOOK_S3_ADDRESSING_STYLE": "path",
        }
        print(f"one {args.mib} MiB output, {args.ranges} Range requests of 1 MiB per store")
        measure("file", {}, to_file, size, args.ranges)
        measure("bucket, stream", bucket_env, to_bucket, size, args.ranges)
        redirect = {**bucket_env, "GENHOOK_OUTPUT_DELIVERY": "redirect"}
        measure("bucket, redirect", redirect, to_bucket, size, args.ranges)
        print(json.dumps({"load": os.getloadavg()}))
    finally:
        s3.stop()


if __name__ == "__main__":
    main()
