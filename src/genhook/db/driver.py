"""Write transactions on the driver connection (``sqlite3``, ``asyncpg``) for the hot paths.

A worker's claim through an ORM session cost about 0.75 ms of CPU, against about 0.15 ms
for the same statements on the ``sqlite3`` connection: the session, the execution context
and the result processing cost several times what the database spends on a short statement.
The statements stay SQLAlchemy Core constructs, defined once with the rest of their table's
SQL; ``compiled`` renders each once per dialect, and a ``Tx`` runs it on the driver
connection, encoding and decoding JSON columns as SQLAlchemy's ``JSON`` type does.

``Tx`` is the port the hot paths are written against. ``Database.transaction`` gives a
driver transaction (``SQLiteTx``, ``PostgresTx``); ``SessionTx`` runs the same code in an ORM
session's transaction, for callers that already hold one (and for an in-memory SQLite
database, which a second connection would not see). Work announced with ``notify`` wakes its
listeners once the transaction commits, as ``genhook.db.wakeups.notify`` does for a session.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import json
import sqlite3
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

from sqlalchemy import JSON, Executable, Insert, Table, bindparam, insert
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncSession

from genhook.db import wakeups

Row = dict[str, Any]


class Tx(Protocol):
    """One write transaction. Statements are Core constructs with named ``bindparam``\\ s;
    rows come back as dicts by column name, JSON columns decoded."""

    async def rows(self, statement: Executable, params: Mapping[str, Any]) -> list[Row]: ...

    async def first(self, statement: Executable, params: Mapping[str, Any]) -> Row | None: ...

    async def run(self, statement: Executable, params: Mapping[str, Any]) -> int:
        """Execute; the number of rows changed."""
        ...

    async def run_many(
        self, statement: Executable, params: Sequence[Mapping[str, Any]]
    ) -> None: ...

    async def notify(self, channel: str) -> None:
        """Wake ``channel``'s listeners once this transaction commits."""
        ...


@dataclass(frozen=True, slots=True)
class Compiled:
    """A statement rendered for one dialect, with what its parameters and rows need."""

    sql: str
    # Parameter names in placeholder order (qmark repeats a name; numeric does not).
    names: tuple[str, ...]
    # Values bound in the statement itself (``status == 'created'``, a LIMIT).
    constants: Mapping[str, Any]
    json_params: frozenset[str]
    columns: tuple[str, ...]
    json_columns: frozenset[int]

    def args(self, params: Mapping[str, Any]) -> list[Any]:
        values = []
        for name in self.names:
            value = params[name] if name in params else self.constants[name]
            # SQLAlchemy's JSON type stores None as JSON null too (none_as_null=False).
            values.append(json.dumps(value) if name in self.json_params else value)
        return values

    def row(self, values: Sequence[Any]) -> Row:
        if not self.json_columns:
            return dict(zip(self.columns, values, strict=True))
        row = {}
        for index, (name, value) in enumerate(zip(self.columns, values, strict=True)):
            if index in self.json_columns and value is not None:
                value = json.loads(value)
            row[name] = value
        return row


@functools.lru_cache(maxsize=512)
def compiled(statement: Executable, dialect: Dialect) -> Compiled:
    """``statement`` rendered for ``dialect``, once: rendering costs more than running it."""
    result = statement.compile(dialect=dialect)  # type: ignore[attr-defined]
    names = tuple(result.positiontup or ())
    binds = result.binds
    constants = {
        name: bind.effective_value
        for name, bind in binds.items()
        if name in names and not bind.required
    }
    expanding = [name for name in names if binds[name].expanding]
    if expanding:  # an expanding IN is rendered per execution: not for this path
        raise ValueError(f"statement parameters cannot be rendered once: {expanding}")
    json_params = frozenset(name for name in names if isinstance(binds[name].type, JSON))
    exported = list(getattr(statement, "exported_columns", ()))  # RETURNING or SELECT
    columns = tuple(column.name for column in exported)
    # On PostgreSQL the dialect's codec, set on every connection it opens, decodes them.
    json_columns = frozenset(
        index
        for index, column in enumerate(exported)
        if isinstance(column.type, JSON) and dialect.name != "postgresql"
    )
    return Compiled(result.string, names, constants, json_params, columns, json_columns)


def bound_insert(table: Table, columns: Iterable[str]) -> Insert:
    """An INSERT of exactly ``columns``, each a parameter of its name: rendered once, so
    every row must give them all (an INSERT without ``values`` would name every column)."""
    return insert(table).values({name: bindparam(name) for name in columns})


# Observers of the driver transactions, as SQLAlchemy's ``before_cursor_execute`` and
# ``begin`` events are of a session's (tests and benchmarks count statements): called with
# each statement's SQL, and at each BEGIN.
on_statement: list[Callable[[str], None]] = []
on_begin: list[Callable[[], None]] = []


def _observe(sql: str) -> None:
    for observer in on_statement:
        observer(sql)


def began() -> None:
    for observer in on_begin:
        observer()


class _Port(abc.ABC):
    """``first``, the same over every ``rows``."""

    @abc.abstractmethod
    async def rows(self, statement: Executable, params: Mapping[str, Any]) -> list[Row]: ...

    async def first(self, statement: Executable, params: Mapping[str, Any]) -> Row | None:
        found = await self.rows(statement, params)
        return found[0] if found else None


class SQLiteTx(_Port):
    """Statements on a ``sqlite3`` connection in autocommit mode, inside the BEGIN IMMEDIATE
    that ``Database.transaction`` issued; errors are raised as SQLAlchemy's, so fault
    handling treats them as it treats the session's."""

    def __init__(self, connection: sqlite3.Connection, dialect: Dialect) -> None:
        self.connection = connection
        self.dialect = dialect
        self.channels: set[str] = set()

    def _execute(self, sql: str, args: Any, many: bool = False) -> sqlite3.Cursor:
        if on_statement:
            _observe(sql)
        try:
            if many:
                return self.connection.executemany(sql, args)
            return self.connection.execute(sql, args)
        except sqlite3.Error as error:
            raise DBAPIError.instance(sql, args, error, sqlite3.Error) from error

    async def rows(self, statement: Executable, params: Mapping[str, Any]) -> list[Row]:
        plan = compiled(statement, self.dialect)
        cursor = self._execute(plan.sql, plan.args(params))
        try:
            return [plan.row(values) for values in cursor.fetchall()]
        except sqlite3.Error as error:
            raise DBAPIError.instance(plan.sql, params, error, sqlite3.Error) from error

    async def run(self, statement: Executable, params: Mapping[str, Any]) -> int:
        plan = compiled(statement, self.dialect)
        return self._execute(plan.sql, plan.args(params)).rowcount

    async def run_many(self, statement: Executable, params: Sequence[Mapping[str, Any]]) -> None:
        plan = compiled(statement, self.dialect)
        self._execute(plan.sql, [plan.args(each) for each in params], many=True)

    async def notify(self, channel: str) -> None:
        self.channels.add(channel)

    def begin(self) -> None:
        self._control("BEGIN IMMEDIATE")
        began()

    def commit(self) -> None:
        self._control("COMMIT")

    def _control(self, sql: str) -> None:
        try:
            self.connection.execute(sql)
        except sqlite3.Error as error:
            raise DBAPIError.instance(sql, (), error, sqlite3.Error) from error

    def rollback(self) -> None:
        if self.connection.in_transaction:
            self.connection.rollback()


class PostgresTx(_Port):
    """Statements on an ``asyncpg`` connection inside its ``transaction()``.

    A constraint violation is raised as SQLAlchemy's ``IntegrityError``, as through a
    session (callers tell a taken key apart by it); asyncpg's other errors pass as they
    are: ``genhook.faults`` knows its connection errors."""

    def __init__(self, connection: Any, dialect: Dialect, *, autocommit: bool = False) -> None:
        self.connection = connection
        self.dialect = dialect
        self.channels: set[str] = set()
        self._transaction: Any = None
        # Outside a transaction (``Database.postgres_transaction(atomic=False)``): each
        # statement is one of its own.
        self.autocommit = autocommit

    async def rows(self, statement: Executable, params: Mapping[str, Any]) -> list[Row]:
        plan = compiled(statement, self.dialect)
        records = await self._call(self.connection.fetch, plan.sql, *plan.args(params))
        return [plan.row(tuple(record)) for record in records]

    async def run(self, statement: Executable, params: Mapping[str, Any]) -> int:
        plan = compiled(statement, self.dialect)
        status: str = await self._call(self.connection.execute, plan.sql, *plan.args(params))
        # "UPDATE 3", "DELETE 0", "INSERT 0 1"
        last = status.rsplit(" ", 1)[-1]
        return int(last) if last.isdigit() else 0

    async def run_many(self, statement: Executable, params: Sequence[Mapping[str, Any]]) -> None:
        plan = compiled(statement, self.dialect)
        rows = [plan.args(each) for each in params]
        await self._call(self.connection.executemany, plan.sql, rows)

    async def notify(self, channel: str) -> None:
        if channel not in self.channels:
            self.channels.add(channel)
            await self.run(wakeups.PG_NOTIFY, wakeups.pg_notify_params(channel))

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        """Hand-written SQL's rows, as asyncpg's records."""
        records: list[Any] = await self._call(self.connection.fetch, sql, *args)
        return records

    async def _call(self, method: Callable[..., Awaitable[Any]], sql: str, *args: Any) -> Any:
        if self.autocommit:
            began()
        if on_statement:
            _observe(sql)
        try:
            return await method(sql, *args)
        except Exception as error:
            self.reraise(error, sql, args)

    async def begin(self) -> None:
        try:
            self._transaction = self.connection.transaction()
            await self._transaction.start()
        except Exception as error:
            self.reraise(error)
        began()

    async def commit(self) -> None:
        try:
            await self._transaction.commit()
        except Exception as error:
            self.reraise(error)

    async def rollback(self) -> None:
        """Quietly: the caller's error is the one to raise, and a connection that cannot
        even roll back is let go of (``Database.transaction``)."""
        with contextlib.suppress(Exception):
            await self._transaction.rollback()

    def reraise(self, error: Exception, sql: str | None = None, args: Any = None) -> NoReturn:
        translated = self._translated(error, sql, args)
        if translated is error:
            raise error
        raise translated from error

    def _translated(self, error: Exception, sql: str | None, args: Any) -> Exception:
        """The error as SQLAlchemy's asyncpg dialect raises it through a session.

        A constraint violation is ``IntegrityError``. Any error that left the connection
        closed (a server restart, a dropped socket, whatever asyncpg called it) is a
        disconnect, ``connection_invalidated``: fault handling retries it, or answers a
        client 503. The rest pass as they are. asyncpg's kinds are known by name: it is not
        imported on an SQLite-only install."""
        if isinstance(error, DBAPIError):
            return error
        kinds = {kind.__name__ for kind in type(error).__mro__}
        if "IntegrityConstraintViolationError" in kinds:
            return IntegrityError(sql, args, error)
        if self.connection.is_closed():
            return OperationalError(sql, args, error, connection_invalidated=True)
        return error


class SessionTx(_Port):
    """The same port over an ORM session's transaction."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def rows(self, statement: Executable, params: Mapping[str, Any]) -> list[Row]:
        connection = await self.session.connection()
        result = await connection.execute(statement, dict(params))
        if not result.returns_rows:
            return []
        return [dict(row._mapping) for row in result]

    async def run(self, statement: Executable, params: Mapping[str, Any]) -> int:
        connection = await self.session.connection()
        result = await connection.execute(statement, dict(params))
        return int(getattr(result, "rowcount", 0) or 0)

    async def run_many(self, statement: Executable, params: Sequence[Mapping[str, Any]]) -> None:
        connection = await self.session.connection()
        await connection.execute(statement, [dict(each) for each in params])

    async def notify(self, channel: str) -> None:
        await wakeups.notify(self.session, channel)


def as_tx(tx: Tx | AsyncSession) -> Tx:
    """``tx``, or a session's transaction behind the same port."""
    return SessionTx(tx) if isinstance(tx, AsyncSession) else tx
