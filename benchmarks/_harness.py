"""Shared pieces of the benchmarks: free ports, waiting for a server, a running service,
a PostgreSQL database, percentiles.

A benchmark stopped with SIGTERM (``timeout``, a cancelled job) unwinds as Ctrl-C does, so
the services and databases it started are stopped on the way out, not left running on the
machine's cores: importing this module arranges it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

# The tests' port picker: a port from bind(0) may be taken by an outgoing connection first.
from tests.support.postgres import free_port as free_port

if TYPE_CHECKING:
    from tests.support.postgres import PostgresServer

ROOT = Path(__file__).resolve().parent.parent


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)


def child_pythonpath() -> str:
    """``PYTHONPATH`` for a service the benchmark starts: the checkout first, then what this
    process was given (a host may keep dependencies in a directory of its own)."""
    return os.pathsep.join(
        [str(ROOT / "src"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )


def postgres_database(stack: contextlib.ExitStack, name: str = "bench") -> PostgresServer:
    """A PostgreSQL server in a temporary directory, stopped with ``stack``, holding an empty
    database ``name`` (its URL: ``server.url(name)``)."""
    from tests.support.postgres import running_postgres

    server = stack.enter_context(running_postgres())
    server.psql(f"CREATE DATABASE {name}")
    return server


def stop_process(process: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; reaped either way."""
    process.terminate()
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_ready(
    url: str,
    timeout: float = 60.0,
    process: subprocess.Popen[bytes] | None = None,
    log: str | None = None,
) -> None:
    """Until ``url`` answers 200; fails at once if ``process`` (the server) exits first,
    quoting the end of its ``log`` (its stderr)."""
    from tests.support.http import HTTP  # not httpx.get: a TLS context per call

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            tail = Path(log).read_text(errors="replace")[-3000:] if log else ""
            raise RuntimeError(f"{url}: the server exited with {process.returncode}\n{tail}")
        try:
            if HTTP.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not become ready")


def children(pid: int) -> list[int]:
    """The process ids whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def argv(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def is_service(pid: int) -> bool:
    """Whether ``pid`` is one of the service's processes (its command line names genhook)."""
    try:
        return b"genhook" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def role_of(pid: int) -> str:
    """``serve`` for the supervisor, else the role and index from the lifeline's argv."""
    args = [a.decode(errors="replace") for a in argv(pid)]
    if "genhook.runtime.lifeline" in args:
        at = args.index("genhook.runtime.lifeline")
        return "-".join(args[at + 2 : at + 4])
    return "serve"


def api_process(supervisor: int, timeout: float = 30.0) -> int:
    """The api child of a ``genhook serve`` supervisor: the process that answers HTTP."""
    deadline = time.monotonic() + timeout
    while True:
        found = [pid for pid in children(supervisor) if b"api" in argv(pid)]
        if found:
            return found[0]
        if time.monotonic() > deadline:
            raise RuntimeError(f"no api process under {supervisor}")
        time.sleep(0.05)


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


@contextlib.contextmanager
def running_service(
    data_dir: str, database_url: str | None, *, ready_timeout: float = 60.0, **settings: str
) -> Iterator[tuple[str, str]]:
    """``genhook serve`` with the test suite's engines, as (base URL, API key); it is stopped,
    children and all, on the way out. ``ready_timeout``: a loaded machine starts slowly."""
    port = free_port()
    env = {
        **os.environ,
        "GENHOOK_DATA_DIR": data_dir,
        "GENHOOK_PORT": str(port),
        "GENHOOK_EXTRA_ENGINES": '["tests.support.engines:register"]',
        "GENHOOK_WORKER_POLL_SECONDS": "0.02",
        "PYTHONPATH": child_pythonpath(),
        "GENHOOK_LOG_LEVEL": "WARNING",
        **{f"GENHOOK_{name.upper()}": value for name, value in settings.items()},
    }
    if database_url:
        env["GENHOOK_DATABASE_URL"] = database_url
    errors = tempfile.NamedTemporaryFile(prefix="genhook-serve-", suffix=".log")  # noqa: SIM115
    server = subprocess.Popen(
        [sys.executable, "-m", "genhook.cli", "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=errors,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(base + "/readyz", ready_timeout, server, errors.name)
        key = json.loads((Path(data_dir) / "credentials.json").read_text())["api_key"]
        yield base, key
    finally:
        stop_process(server)
        errors.close()
