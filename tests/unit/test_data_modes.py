"""A data directory left wider by an older version or an operator is tightened whole at
start (directories 0700, everything else 0600), and the start says what it changed."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import pytest

from genhook.config import Settings
from genhook.files import tighten_data


def test_start_tightens_every_path_of_the_data_directory_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"
    outside_blobs = tmp_path / "blobs-elsewhere"
    layout = {
        "credentials.json": b"{}",
        "webhook-encryption.key": b"k\n",
        "genhook.db": b"",
        "blobs/outputs/ab/task.png": b"png",
        "blobs/inputs/cd/task.jpg": b"jpg",
        "metrics/host-1/counts.json": b"{}",
    }
    for name, content in layout.items():
        path = data / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    (outside_blobs / "outputs").mkdir(parents=True)
    (outside_blobs / "outputs" / "x.png").write_bytes(b"png")
    wake = data / "wake" / "tasks"
    wake.mkdir(parents=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(wake / "1-a.sock"))
    (data / "elsewhere").symlink_to(tmp_path)
    for root in (data, outside_blobs):
        for directory, _, files in os.walk(root):
            os.chmod(directory, 0o755)
            for name in files:
                os.chmod(Path(directory) / name, 0o644)
    os.chmod(wake / "1-a.sock", 0o666)
    os.chmod(tmp_path, 0o755)
    settings = Settings(data_dir=data, blob_store=str(outside_blobs))
    try:
        with caplog.at_level(logging.WARNING, logger="genhook.files"):
            changed = tighten_data(settings)
    finally:
        sock.close()
    for root in (data, outside_blobs):
        for directory, _, files in os.walk(root):
            assert os.stat(directory).st_mode & 0o777 == 0o700, directory
            for name in files:
                assert os.lstat(Path(directory) / name).st_mode & 0o777 == 0o600, name
    # A link is not followed: what it points at is not the service's to change.
    assert tmp_path.stat().st_mode & 0o777 == 0o755
    assert (data / "credentials.json", 0o644, 0o600) in changed
    assert (data / "wake" / "tasks" / "1-a.sock", 0o666, 0o600) in changed
    assert (outside_blobs / "outputs" / "x.png", 0o644, 0o600) in changed
    line = caplog.records[-1].getMessage()
    assert f"tightened the modes of {len(changed)} path(s)" in line
    assert "credentials.json 0644 -> 0600" in line or "more" in line
    # A second start finds nothing to change and says nothing.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="genhook.files"):
        assert tighten_data(settings) == []
    assert caplog.records == []
