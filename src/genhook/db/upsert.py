"""``INSERT ... ON CONFLICT`` in the database's own dialect.

Chosen per call so that a process on SQLite never loads SQLAlchemy's PostgreSQL dialect
(about 60 ms of start-up in every role process)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy.dialects.sqlite import insert as sqlite_insert

if TYPE_CHECKING:
    from sqlalchemy.dialects.postgresql import Insert as PgInsert
    from sqlalchemy.dialects.sqlite import Insert as SqliteInsert
    from sqlalchemy.sql._typing import _DMLTableArgument


def upsert(table: _DMLTableArgument, *, postgres: bool) -> PgInsert | SqliteInsert:
    """An insert into ``table`` that takes ``on_conflict_do_nothing/do_update``."""
    if postgres:
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table)
    return sqlite_insert(table)
