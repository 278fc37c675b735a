"""Counting the SQL statements a process sends, for the benchmarks' statements-per-task
figures: a SQLAlchemy ``before_cursor_execute`` listener on both engines of a Database."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

from sqlalchemy import event

from genhook.db import Database


class StatementCounter:
    """Counts every statement sent through ``db`` by kind (``UPDATE tasks``, ``BEGIN``, ...)
    until ``close``; ``paused`` leaves the benchmark's own queries out."""

    def __init__(self, db: Database) -> None:
        self.kinds: Counter[str] = Counter()
        self._paused = False
        engines = {id(engine): engine.sync_engine for engine in (db.write_engine, db.read_engine)}
        self._engines = list(engines.values())
        for engine in self._engines:
            event.listen(engine, "before_cursor_execute", self._count)
            event.listen(engine, "begin", self._begin)

    def _count(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not self._paused:
            self.kinds[kind_of(statement)] += 1

    def _begin(self, conn: Any) -> None:
        # SQLite's explicit BEGIN goes to sqlite3 directly, past ``before_cursor_execute``.
        if not self._paused and conn.dialect.name == "sqlite":
            self.kinds["BEGIN"] += 1

    @property
    def total(self) -> int:
        return sum(self.kinds.values())

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self._paused = True
        try:
            yield
        finally:
            self._paused = False

    def close(self) -> None:
        for engine in self._engines:
            event.remove(engine, "before_cursor_execute", self._count)
            event.remove(engine, "begin", self._begin)

    def summary(self, tasks: int) -> str:
        """Statements per task, in all and by kind."""
        parts = ", ".join(f"{kind} {n / tasks:.2f}" for kind, n in self.kinds.most_common())
        return f"{self.total / tasks:.2f} SQL statements per task ({parts})"


QUOTE = '"'


def kind_of(statement: str) -> str:
    words = statement.split()
    if not words:
        return "?"
    verb = words[0].upper()
    if verb in ("UPDATE", "DELETE", "INSERT") and len(words) > 2:
        table = words[1] if verb == "UPDATE" else words[2]
        return f"{verb} {table.strip(QUOTE)}"
    if verb == "SELECT" and "FROM" in words:
        return f"SELECT {words[words.index('FROM') + 1].strip(QUOTE)}"
    return verb
