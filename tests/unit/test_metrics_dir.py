"""Where ``genhook serve`` counts: its own directory per supervisor, those of supervisors
that are gone removed, an operator's directory emptied at start."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from genhook import metrics
from genhook.config import Settings


def test_each_supervisor_counts_apart_and_gone_ones_are_removed(tmp_path: Path) -> None:
    host = socket.gethostname()
    base = tmp_path / "metrics"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = base / f"{host}-{gone.pid}"
    living = base / f"{host}-{os.getppid()}"  # another supervisor still running
    elsewhere = base / f"another-host-{gone.pid}"  # not this machine's to judge
    for directory in (stale, living, elsewhere):
        directory.mkdir(parents=True)
        (directory / "counter_1.db").write_bytes(b"")
    path, clean = metrics.serve_directory(Settings(data_dir=tmp_path))
    assert (path, clean) == (base / f"{host}-{os.getpid()}", True)
    assert not stale.exists()
    assert living.exists() and elsewhere.exists()


def test_an_operators_directory_is_used_and_emptied(tmp_path: Path) -> None:
    chosen = tmp_path / "chosen"
    path, clean = metrics.serve_directory(Settings(data_dir=tmp_path, metrics_dir=chosen))
    assert (path, clean) == (chosen, True)
