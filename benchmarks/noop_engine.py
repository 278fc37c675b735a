"""A model that does almost no work, registered through ``GENHOOK_EXTRA_ENGINES``, so a task's
CPU cost is the service's own (see ``benchmarks/task_overhead.py``).

``bench/noop`` takes the edit request (one small input image, stored and deleted with its
task like any other) and returns a constant 1×1 PNG, which the worker stores as the task's
output. With ``GENHOOK_BENCH_SQL_DIR`` set, every process that loads this module counts the
SQL statements and the transactions it sends and writes the counts to ``<dir>/<pid>.json``
every 20 ms.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine as SQLEngine

from genhook.config import Settings
from genhook.engines.base import Engine, EngineJob, EngineOutput, EngineResult, ModelKind, ModelSpec
from genhook.engines.edit_request import EditRequest
from genhook.engines.registry import Registry, edit_pricing

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)


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
    """Statements and transactions of this process, written to a file a benchmark reads from
    outside."""

    def __init__(self, directory: Path) -> None:
        self.count = 0
        self.transactions = 0
        self.path = directory / f"{os.getpid()}.json"
        event.listen(SQLEngine, "before_cursor_execute", self._on_statement)
        event.listen(SQLEngine, "begin", self._on_begin)
        threading.Thread(target=self._write_loop, name="bench-sql-count", daemon=True).start()

    def _on_statement(self, *args: Any) -> None:
        self.count += 1

    def _on_begin(self, conn: Any) -> None:
        self.transactions += 1
        # SQLite's explicit BEGIN goes to sqlite3 directly, past ``before_cursor_execute``;
        # still a statement, as in the figures measured before.
        if conn.dialect.name == "sqlite":
            self.count += 1

    def _write_loop(self) -> None:
        stopped = threading.Event()
        while not stopped.wait(0.02):
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"statements": self.count, "tx": self.transactions}))
            tmp.replace(self.path)


_counter: _SQLCount | None = None


def register(registry: Registry) -> None:
    global _counter
    registry.register(NOOP)
    directory = os.environ.get("GENHOOK_BENCH_SQL_DIR")
    if directory and _counter is None:
        _counter = _SQLCount(Path(directory))
