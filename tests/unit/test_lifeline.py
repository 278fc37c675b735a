"""``die_with_parent``: how every child of ours (a role of ``genhook serve``, a worker's model
process) learns that its parent died, however it died. The parent holds the only write end of
a pipe; the child's end sees end-of-file when the kernel closes it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from genhook.runtime.lifeline import ORPHAN_SIGNAL

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}

# A child that watches its parent's lifeline; "handled": it leaves its own way, as a role does.
CHILD = """
import os, signal, sys, time
from genhook.runtime.lifeline import ORPHAN_SIGNAL, die_with_parent

def leave(*_):
    os.write(1, b"released\\n")
    os._exit(0)

if sys.argv[1] == "handled":
    signal.signal(ORPHAN_SIGNAL, leave)
die_with_parent(int(sys.argv[2]), int(sys.argv[3]))
os.write(1, b"watching\\n")
time.sleep(600)
"""

# A parent that starts the child with its lifeline, then waits to be killed.
PARENT = """
import os, subprocess, sys, time
read, write = os.pipe()
child = subprocess.Popen(
    [sys.executable, "-c", sys.argv[1], sys.argv[2], str(os.getpid()), str(read)],
    pass_fds=(read,),
)
os.write(1, f"{child.pid}\\n".encode())
time.sleep(600)
"""


def killed_parent(mode: str) -> tuple[int, bytes]:
    """Start a parent and its child, SIGKILL the parent once the child watches, and read
    what the child writes until it ends (its standard output, which the parent shared, reaches
    end-of-file only then)."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD, mode], stdout=subprocess.PIPE, env=ENV
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        assert parent.stdout.readline() == b"watching\n"
        parent.kill()
        parent.wait()
        rest, _ = parent.communicate(timeout=60)
        return child, rest
    finally:
        parent.kill()
        parent.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def test_a_child_ends_when_its_parent_is_killed() -> None:
    child, rest = killed_parent("default")
    assert rest == b""
    assert _ends(child)


def test_a_child_that_handles_the_signal_leaves_its_own_way_when_its_parent_is_killed() -> None:
    child, rest = killed_parent("handled")
    assert rest == b"released\n"
    assert _ends(child)


def test_a_child_whose_parent_died_before_it_watched_ends_at_once() -> None:
    """The lifeline's write end closed before the child begins to watch: no window."""
    read, write = os.pipe()
    os.close(write)
    try:
        child = subprocess.run(
            [sys.executable, "-c", CHILD, "default", str(os.getpid()), str(read)],
            pass_fds=(read,),
            env=ENV,
            capture_output=True,
            timeout=60,
        )
    finally:
        os.close(read)
    assert child.returncode == -ORPHAN_SIGNAL, child.stderr


def test_a_child_whose_parent_is_not_the_one_named_ends() -> None:
    """The parent's id is compared too: a write end held open by someone else (here: the
    test, which is not the parent named) does not keep the child alive."""
    read, write = os.pipe()
    try:
        child = subprocess.run(
            [sys.executable, "-c", CHILD, "default", "1", str(read)],
            pass_fds=(read,),
            env=ENV,
            capture_output=True,
            timeout=60,
        )
    finally:
        os.close(read)
        os.close(write)
    assert child.returncode == -ORPHAN_SIGNAL, child.stderr


def _ends(pid: int) -> bool:
    """Whether ``pid`` ends (a zombie at most: nothing of it runs); it closed its output as
    it exited, so this is a moment, but not an instant."""
    for _ in range(600):
        try:
            stat = Path(f"/proc/{pid}/stat").read_bytes()
        except FileNotFoundError:
            return True
        if stat.rsplit(b")", 1)[1].split()[0] == b"Z":
            return True
        time.sleep(0.05)
    return False
