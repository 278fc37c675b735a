"""A model that does almost no work, registered through ``GENHOOK_EXTRA_ENGINES``, so a task's
CPU cost is the service's own (see ``benchmarks/task_overhead.py``).

``bench/noop`` takes the edit request (one small input image, stored and deleted with its
task like any other) and returns a constant 1×1 PNG, which the worker stores as the task's
output. With ``GENHOOK_BENCH_SQL_DIR`` set, every process that loads this module counts the
SQL statements and the transactions it sends into ``<dir>/<pid>.counts`` (two 64-bit
integers in a shared memory map; ``read_counts`` reads them).
"""

from __future__ import annotations

import base64
import mmap
import os
import struct
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine as SQLEngine

from genhook.config import Settings
from genhook.db import driver
from genhook.engines.base import Engine, EngineJob, EngineOutput, EngineResult, ModelKind, ModelSpec
from genhook.engines.edit_request import EditRequest
from genhook.engines.registry import Registry, edit_pricing

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)

# What ``<dir>/<pid>.counts`` holds: statements, then transactions.
COUNTS = struct.Struct("<qq")
COUNTS_SUFFIX = ".counts"


class NoopEngine:
    def load(self) -> None:
        pass

    def run(self, job: EngineJob) -> EngineResult:
        return EngineResult(outputs=[EngineOutput(data=PNG, content_type="image/png")], info={})


def _noop(settings: Settings) -> Engine:
    return NoopEngine()


NOOP = ModelSpec(
    id="bench/noop",
    kind=ModelKind.IMAGE,
    request_schema=EditRequest,
    engine_factory=_noop,
    pricing=edit_pricing,
)


class _SQLCount:
    """Statements and transactions of this process, kept in a shared memory map that a
    benchmark reads from outside.

    A store into the map costs well under a microsecond and needs no thread: a file
    rewritten every 20 ms instead cost the measured process about 0.3 ms of CPU per task.
    """

    def __init__(self, directory: Path) -> None:
        self.count = 0
        self.transactions = 0
        path = directory / f"{os.getpid()}{COUNTS_SUFFIX}"
        with open(path, "wb+") as handle:
            handle.write(bytes(COUNTS.size))
            handle.flush()
            self.map = mmap.mmap(handle.fileno(), COUNTS.size)
        event.listen(SQLEngine, "before_cursor_execute", self._on_statement)
        event.listen(SQLEngine, "begin", self._on_begin)
        # The worker's transactions on the driver connection, past SQLAlchemy's events.
        driver.on_statement.append(self._on_statement)
        driver.on_begin.append(self._on_driver_begin)

    def _on_statement(self, *args: Any) -> None:
        self.count += 1
        COUNTS.pack_into(self.map, 0, self.count, self.transactions)

    def _on_driver_begin(self) -> None:
        self.transactions += 1
        self.count += 1  # the BEGIN, as on SQLite below
        COUNTS.pack_into(self.map, 0, self.count, self.transactions)

    def _on_begin(self, conn: Any) -> None:
        self.transactions += 1
        # SQLite's explicit BEGIN goes to sqlite3 directly, past ``before_cursor_execute``;
        # still a statement, as in the figures measured before.
        if conn.dialect.name == "sqlite":
            self.count += 1
        COUNTS.pack_into(self.map, 0, self.count, self.transactions)


def read_counts(directory: Path, pid: int) -> tuple[int, int]:
    """The statements and transactions a process has sent so far (0, 0 before its first)."""
    try:
        data = (directory / f"{pid}{COUNTS_SUFFIX}").read_bytes()
    except FileNotFoundError:
        return 0, 0
    if len(data) < COUNTS.size:
        return 0, 0
    statements, transactions = COUNTS.unpack_from(data)
    return int(statements), int(transactions)


_counter: _SQLCount | None = None


def register(registry: Registry) -> None:
    global _counter
    registry.register(NOOP)
    directory = os.environ.get("GENHOOK_BENCH_SQL_DIR")
    if directory and _counter is None:
        _counter = _SQLCount(Path(directory))
