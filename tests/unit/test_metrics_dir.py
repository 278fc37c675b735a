"""Where ``genhook serve`` counts: its own directory per supervisor, those of supervisors
that are gone removed, an operator's directory emptied at start."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from genhook import files, metrics
from genhook.config import Settings


def test_each_supervisor_counts_apart_and_gone_ones_are_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "SHARED_MEMORY", tmp_path / "shm")
    (tmp_path / "shm").mkdir()
    host = socket.gethostname()
    base = tmp_path / "shm" / f"genhook-{os.getuid()}" / "metrics"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = base / f"{host}-{gone.pid}"
    living = base / f"{host}-{os.getppid()}"  # another supervisor still running
    elsewhere = base / f"another-host-{gone.pid}"  # not this machine's to judge
    for directory in (stale, living, elsewhere):
        directory.mkdir(parents=True)
        (directory / "counter_1.db").write_bytes(b"")
    base.parent.chmod(0o700)  # the private directory shared memory must hold
    path, clean = metrics.serve_directory(Settings(data_dir=tmp_path / "data"))
    assert (path, clean) == (base / f"{host}-{os.getpid()}", True)
    assert not stale.exists()
    assert living.exists() and elsewhere.exists()


def test_an_operators_directory_is_used_and_emptied(tmp_path: Path) -> None:
    chosen = tmp_path / "chosen"
    path, clean = metrics.serve_directory(Settings(data_dir=tmp_path, metrics_dir=chosen))
    assert (path, clean) == (chosen, True)


def test_without_private_shared_memory_the_data_directory_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shm = tmp_path / "shm"
    (shm / f"genhook-{os.getuid()}").mkdir(parents=True, mode=0o777)
    (shm / f"genhook-{os.getuid()}").chmod(0o777)  # someone else could plant files in it
    monkeypatch.setattr(files, "SHARED_MEMORY", shm)
    path, _ = metrics.serve_directory(Settings(data_dir=tmp_path / "data"))
    assert path.parent == tmp_path / "data" / "metrics"


_COUNT_MANY = """
import sys
from pathlib import Path
from genhook import files, metrics
from genhook.config import Settings
metrics.use_directory(*metrics.serve_directory(Settings(data_dir=Path(sys.argv[1]))))
for number in range(3000):
    metrics.TASKS_SUBMITTED.labels(model=f"model-{number}").inc()
print(metrics.multiprocess_dir())
"""


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/dev/shm").is_dir(), reason="mounts a tmpfs")
def test_a_full_data_disk_does_not_kill_a_process_that_counts(tmp_path: Path) -> None:
    """The data directory on a full 256 KiB file system: counting (whose files grow past
    it) must not end the process with SIGBUS, as it did with the files on the data disk."""
    data = tmp_path / "data"
    data.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(data)], check=True)
    try:
        fd = os.open(data / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"x" * 4096)
        finally:
            os.close(fd)
        done = subprocess.run(
            [sys.executable, "-c", _COUNT_MANY, str(data)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
        counted = Path(done.stdout.strip())
        assert not counted.is_relative_to(data)
        shutil.rmtree(counted, ignore_errors=True)
    finally:
        subprocess.run(["umount", "-l", str(data)], check=False)
