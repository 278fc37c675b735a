"""The cores a worker's models compute on follow the process's CPU affinity (``taskset``, a
container's cpuset), not the machine's count: on a machine of 64 cores a process allowed one
would otherwise start 64 threads per model on it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

SHARE = """
import os
from genhook.config import Settings
from genhook.engines.onnx import shared_threads, usable_cores

os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
print(usable_cores(), shared_threads(Settings(workers=1)), shared_threads(Settings(workers=4)))
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_a_process_allowed_one_core_computes_on_one() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SHARE],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.split() == ["1", "1", "1"]


def test_the_share_divides_the_usable_cores_among_the_workers() -> None:
    from genhook.config import Settings
    from genhook.engines.onnx import shared_threads, usable_cores

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert usable_cores() == cores
    assert shared_threads(Settings(workers=1)) == cores
    assert shared_threads(Settings(workers=cores * 2)) == 1
