"""A real PostgreSQL server for the test run, started in a temporary directory.

Uses the image's ``initdb``/``pg_ctl`` (``scripts/ensure-postgres.sh`` installs them when
missing). PostgreSQL refuses to run as root, so as root the server runs as ``postgres``.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.leftovers import temporary_directory

CANDIDATE_BIN_DIRS = [
    Path(p) for p in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
]


def _find(binary: str) -> str:
    found = shutil.which(binary)
    if found:
        return found
    for directory in CANDIDATE_BIN_DIRS:
        if (directory / binary).exists():
            return str(directory / binary)
    raise RuntimeError(
        f"{binary} not found: run scripts/ensure-postgres.sh (installs Debian's postgresql)"
    )


# Ports handed out by ``free_port``: below the kernel's ephemeral range (Linux's default starts
# at 32768), above the well-known ones.
_LOWEST_PORT = 10000
# Its own generator: a test's seeding of the global one (Hypothesis does) must not make two
# test processes pick the same ports.
_ports = random.Random()


def free_port() -> int:
    """A port nothing listens on, for a server a test starts.

    Not one from ``bind(0)``: those come from the ephemeral range, where any process's next
    outgoing connection may take the port before the server binds it (``Address already in
    use``). A random port below that range is taken only by another test's server, and that
    is checked here."""
    ceiling = _ephemeral_floor()
    for _ in range(200):
        port = _ports.randrange(_LOWEST_PORT, ceiling)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port between {_LOWEST_PORT} and {ceiling}")


def _ephemeral_floor() -> int:
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return max(_LOWEST_PORT + 1000, int(text.split()[0]))
    except (OSError, ValueError, IndexError):
        return 32768


@dataclass
class PostgresServer:
    port: int
    datadir: Path

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{database}"

    def _psql(self, database: str, *options: str) -> list[str]:
        return [
            _find("psql"),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "-d",
            database,
            *options,
        ]

    def psql(self, sql: str) -> None:
        command = self._psql("postgres", "-v", "ON_ERROR_STOP=1", "-q", "-c", sql)
        subprocess.run(command, check=True, capture_output=True)

    def rows(self, sql: str, database: str = "postgres") -> list[tuple[str, ...]]:
        """The rows of one query, as text, through psql (no client library in the test)."""
        command = self._psql(database, "-At", "-F", "\t", "-c", sql)
        out = subprocess.run(command, check=True, capture_output=True, text=True)
        return [tuple(line.split("\t")) for line in out.stdout.splitlines() if line]

    def terminate(self, where: str) -> None:
        """End the backends that match ``where`` (a condition on ``pg_stat_activity``), as a
        restart ends every connection, and wait until the server has closed them. It
        blocks: a caller's event loop does not run meanwhile, so its asyncpg connections
        learn of the close only when next used (or once the loop runs again)."""
        self.psql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {where}")
        for _ in range(250):
            if not self.rows(f"SELECT 1 FROM pg_stat_activity WHERE {where}"):
                return
            time.sleep(0.02)
        raise AssertionError(f"backends where {where} still there")

    def restart(self) -> None:
        """A fast restart (``pg_ctl restart -m fast``): every connection is cut, the data stays."""
        env = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
        subprocess.run(
            _as_postgres(
                [
                    _find("pg_ctl"),
                    "-D",
                    str(self.datadir),
                    "-l",
                    str(self.datadir.parent / "log"),
                    "-m",
                    "fast",
                    "-w",
                    "-t",
                    "60",
                    "restart",
                ]
            ),
            check=True,
            capture_output=True,
            env=env,
        )


def _as_postgres(cmd: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *cmd]
    return cmd


@contextlib.contextmanager
def running_postgres() -> Iterator[PostgresServer]:
    root = temporary_directory("genhook-pg-")
    datadir = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    port = free_port()
    env = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
    subprocess.run(
        _as_postgres(
            [
                _find("initdb"),
                "-D",
                str(datadir),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ]
        ),
        check=True,
        capture_output=True,
        env=env,
    )
    options = (
        f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off "
        "-c synchronous_commit=off -c full_page_writes=off -c max_connections=300"
    )
    subprocess.run(
        _as_postgres(
            [
                _find("pg_ctl"),
                "-D",
                str(datadir),
                "-o",
                options,
                "-l",
                str(root / "log"),
                "-w",
                "-t",
                "60",
                "start",
            ]
        ),
        check=True,
        capture_output=True,
        env=env,
    )
    try:
        server = PostgresServer(port, datadir)
        for _ in range(100):
            try:
                server.psql("SELECT 1")
                break
            except subprocess.CalledProcessError:
                time.sleep(0.1)
        yield server
    finally:
        subprocess.run(
            _as_postgres([_find("pg_ctl"), "-D", str(datadir), "-m", "immediate", "-w", "stop"]),
            capture_output=True,
            env=env,
        )
        # The directory goes with the run's (tests/support/leftovers.py), outside any test's
        # time limit: a cluster that held a database per test has tens of thousands of files,
        # and removing them can outlast a test's budget.
