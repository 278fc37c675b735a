"""The Alembic migrations build exactly the schema the models describe, on both databases."""

from __future__ import annotations

import importlib
import logging
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from genhook.db.migrate import alembic_config, upgrade_in_thread
from genhook.db.models import Base

_queue_vacuum = importlib.import_module("genhook.db.migrations.versions.0010_queue_vacuum")
QUEUE_TABLES: tuple[str, ...] = _queue_vacuum.QUEUE_TABLES
QUEUE_STORAGE: dict[str, str] = _queue_vacuum.QUEUE_STORAGE


async def test_migrations_match_models(database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    upgrade_in_thread(database_url)
    # One line of ours says what changed (a start that changes nothing says nothing).
    assert [r.getMessage() for r in caplog.records if r.name.startswith("genhook.db")] == [
        f"database schema upgraded from empty to {_newest()}"
    ]
    caplog.clear()
    upgrade_in_thread(database_url)  # a second run is a no-op
    assert not [r for r in caplog.records if r.name.startswith("genhook.db")]
    engine = create_async_engine(database_url)

    def diff(connection: Any) -> list[Any]:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return list(compare_metadata(context, Base.metadata))

    async with engine.connect() as connection:
        differences = await connection.run_sync(diff)
    await engine.dispose()
    assert differences == []


def _newest() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None
    return head


@pytest.mark.postgres
async def test_queue_tables_are_vacuumed_early_on_postgresql(pg_url: str) -> None:
    upgrade_in_thread(pg_url)
    engine = create_async_engine(pg_url)
    try:
        async with engine.connect() as connection:
            rows = await connection.execute(
                text("SELECT relname, reloptions FROM pg_class WHERE relname = ANY(:names)"),
                {"names": list(QUEUE_TABLES)},
            )
            options = {name: set(reloptions or []) for name, reloptions in rows}
    finally:
        await engine.dispose()
    expected = {f"{name}={value}" for name, value in QUEUE_STORAGE.items()}
    assert options == {table: expected for table in QUEUE_TABLES}
