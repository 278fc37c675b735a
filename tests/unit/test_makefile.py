"""``make serve`` as a newcomer's first command: it says what it is doing while it installs."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_serve_shows_progress_while_it_installs(tmp_path: Path) -> None:
    # -n: the commands a first `make serve` would run, into a virtualenv that does not exist.
    # A fresh make, not a sub-make of the one running the suite (`make test`), which would
    # add its "Entering/Leaving directory" lines.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    shown = subprocess.run(
        ["make", "--no-print-directory", "-n", "serve", f"VENV={tmp_path / 'venv'}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    [install] = [line for line in shown if "pip install" in line and ".[server]" in line]
    # The long step is not silenced: pip prints each package and its progress.
    assert "--quiet" not in install and "-q " not in install
    said = [line for line in shown if line.startswith("echo ")]
    before = shown.index(install)
    assert any("installing genhook" in line for line in said if shown.index(line) < before)
    assert shown[-1].rstrip().endswith("genhook serve")
