"""How long ``genhook serve`` takes to start, and the CPU its processes spend getting there.

    .venv/bin/python benchmarks/startup.py [--rounds 3] [--workers 1]

Each round starts the service on a fresh SQLite data directory, waits for ``/readyz`` to
answer 200, then reads the CPU time (user + system) each process of the tree has used so
far: the supervisor (``serve``, which also runs the migrations), the api, the workers and the
dispatcher. Most of a role's CPU before it serves is importing modules, so this is the figure
that lazy imports move. Prints each round and the medians. On a shared machine the wall time
follows the load; the CPU figures are steadier.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._harness import children, is_service, median, role_of, running_service  # noqa: E402
from benchmarks._proc import cpu_seconds, descendants  # noqa: E402


def _role(pid: int) -> str:
    """``serve``, ``api``, ``worker-0``...: ``role_of`` without the lifeline's pipe number."""
    head, _, rest = role_of(pid).partition("-")
    return rest if head.isdigit() and rest else role_of(pid)


def one_round(workers: int) -> tuple[float, dict[str, float]]:
    """(seconds to ready, CPU seconds per process at ready)."""
    with tempfile.TemporaryDirectory(prefix="genhook-startup-") as data:
        started = time.monotonic()
        with running_service(data, None, ready_timeout=180.0, workers=str(workers)):
            ready = time.monotonic() - started
            (supervisor,) = [pid for pid in children(os.getpid()) if is_service(pid)]
            tree = [supervisor, *descendants(supervisor)]
            cpu = {_role(pid): cpu_seconds([pid]) for pid in tree if is_service(pid)}
    return ready, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    print(f"load: {Path('/proc/loadavg').read_text().strip()}")
    readies: list[float] = []
    per_role: dict[str, list[float]] = {}
    for n in range(args.rounds):
        ready, cpu = one_round(args.workers)
        readies.append(ready)
        for role, seconds in cpu.items():
            per_role.setdefault(role, []).append(seconds)
        roles = "  ".join(f"{role} {seconds:.2f}" for role, seconds in sorted(cpu.items()))
        print(
            f"round {n + 1}: ready in {ready:.2f} s; CPU s: {roles}; total {sum(cpu.values()):.2f}"
        )
    medians = "  ".join(f"{role} {median(v):.2f}" for role, v in sorted(per_role.items()))
    print(f"median: ready in {median(readies):.2f} s; CPU s: {medians}")
    print(f"load: {Path('/proc/loadavg').read_text().strip()}")


if __name__ == "__main__":
    main()
