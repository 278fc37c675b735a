"""A role that cannot start stops ``genhook serve`` (exit status 1) instead of being restarted
for ever while the service looks up; a role that ran a while is always restarted, unless it
says it cannot start (a worker whose preload fails)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from genhook.runtime.supervisor import EXIT_CANNOT_START, START_ATTEMPTS, START_SECONDS, Child

SRC = Path(__file__).resolve().parents[2] / "src"


def test_a_role_that_never_starts_stops_the_supervisor(tmp_path: Path) -> None:
    """The real supervisor program, with one child whose every start fails (the lifeline
    refuses an unknown role and exits 1): it gives up after ``START_ATTEMPTS`` starts, says
    which role, and exits 1."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    config = {
        "children": [["no-such-role", 0]],
        "payload": json.dumps({"data_dir": str(tmp_path)}),
        "listen_fd": listener.fileno(),
        "grace": 1.0,
        "log_level": "INFO",
        "log_format": "text",
    }
    with tempfile.TemporaryFile(dir=tmp_path) as handle:
        handle.write(json.dumps(config).encode())
        handle.flush()
        handle.seek(0)
        fd = handle.fileno()
        started = time.monotonic()
        try:
            result = subprocess.run(
                [sys.executable, "-m", "genhook.runtime.supervisor", str(fd)],
                pass_fds=(fd, listener.fileno()),
                env={**os.environ, "PYTHONPATH": str(SRC)},
                capture_output=True,
                timeout=60,
            )
        finally:
            listener.close()
    errors = result.stderr.decode()
    assert result.returncode == 1, errors
    assert errors.count("unknown role 'no-such-role'") == START_ATTEMPTS, errors
    assert (
        f"no-such-role-0 failed at each of its last {START_ATTEMPTS} starts, the last with "
        "status 1 (its error is above)" in errors
    ), errors
    # The restarts wait a little longer each time, but not for long.
    assert time.monotonic() - started < 40


@pytest.mark.parametrize(
    ("runs", "expected"),
    [
        # (seconds each run lasted, exit code), in order; whether the last exit stops the service
        ([(0.1, 1)] * START_ATTEMPTS, True),
        ([(0.1, 1)] * (START_ATTEMPTS - 1), False),
        # Killed from outside at each start: not a failure of its own.
        ([(0.1, -9)] * START_ATTEMPTS, False),
        # It ran a while once: later failures at start may pass, it is always restarted.
        ([(START_SECONDS + 1, 1)] + [(0.1, 1)] * (START_ATTEMPTS * 2), False),
        # A long run in between starts the count again.
        ([(0.1, 1)] * (START_ATTEMPTS - 1) + [(START_SECONDS + 1, 0), (0.1, 1)], False),
        # A worker whose preload failed could not start, however long it took to fail.
        ([(START_SECONDS + 30, EXIT_CANNOT_START)] * START_ATTEMPTS, True),
        ([(START_SECONDS + 30, EXIT_CANNOT_START)] * (START_ATTEMPTS - 1), False),
    ],
)
def test_which_exits_stop_the_service(runs: list[tuple[float, int]], expected: bool) -> None:
    child = Child("worker", 0)
    now = 100.0
    verdicts = []
    for seconds, code in runs:
        child.started_at = now
        now += seconds
        verdicts.append(child.exited(now, code))
    assert verdicts[-1] is expected
    assert not any(verdicts[:-1])
