"""A process tree's CPU time and memory, read from /proc (Linux), for the benchmarks that
measure the whole service: the supervisor, its workers and helper processes."""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    """``pid``'s children, their children and so on (not ``pid`` itself)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in found:
                    found.append(child)
                    todo.append(child)
    return found


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU time of the live processes among ``pids``."""
    return sum(cpu_seconds_of(Path(f"/proc/{pid}/stat")) for pid in pids)


def main_thread_seconds(pid: int) -> float:
    """User and system CPU time of ``pid``'s main thread alone (its event loop, for a role)."""
    return cpu_seconds_of(Path(f"/proc/{pid}/task/{pid}/stat"))


def cpu_seconds_of(stat: Path) -> float:
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def memory_bytes(pids: list[int]) -> tuple[int, int]:
    """(RSS, PSS) summed over ``pids``: RSS counts shared pages in every process; PSS
    shares them out, so it is what the tree really costs."""
    rss = pss = 0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            name, _, value = line.partition(":")
            if name == "Rss":
                rss += int(value.split()[0]) * 1024
            elif name == "Pss":
                pss += int(value.split()[0]) * 1024
    return rss, pss


def names(pids: list[int]) -> list[str]:
    """Short command lines, to show what the tree holds."""
    out = []
    for pid in pids:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        out.append(" ".join(a.decode(errors="replace") for a in argv[1:5] if a))
    return out
