"""A benchmark stopped with SIGTERM (``timeout``, a cancelled job) stops the service it
started, children and all, instead of leaving it on the machine's cores."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.processes import processes_with

ROOT = Path(__file__).resolve().parents[2]

# One worker: the supervisor's children of every kind are there, one process fewer to start.
BENCHMARK = """
import sys, time
from benchmarks._harness import running_service
with running_service(sys.argv[1], None, ready_timeout=120, workers="1") as (base, key):
    print("up", flush=True)
    time.sleep(600)
"""


def _processes_of(data_dir: Path) -> list[int]:
    """The service's processes, children included: their environment names ``data_dir``."""
    return processes_with("GENHOOK_DATA_DIR", str(data_dir))


def test_sigterm_to_a_benchmark_stops_its_service(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    benchmark = subprocess.Popen(
        [sys.executable, "-c", BENCHMARK, str(data)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert benchmark.stdout is not None
        assert benchmark.stdout.readline() == b"up\n"
        assert _processes_of(data), "the service is not running"
        benchmark.send_signal(signal.SIGTERM)
        assert benchmark.wait(60) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while _processes_of(data) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _processes_of(data) == []
    finally:
        benchmark.kill()
        benchmark.wait()
        for pid in _processes_of(data):
            os.kill(pid, signal.SIGKILL)
