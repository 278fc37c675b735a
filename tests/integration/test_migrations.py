"""The Alembic migrations build exactly the schema the models describe, on both databases."""

from __future__ import annotations

import importlib
import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from genhook.db.migrate import alembic_config, newest_revision, schema_problem, upgrade_in_thread
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


def test_pending_deliveries_take_their_tasks_trace_context(tmp_path: Path) -> None:
    """0014 copies a task's traceparent into its pending deliveries; finished ones keep none."""
    from alembic import command
    from sqlalchemy import create_engine

    url = f"sqlite+pysqlite:///{tmp_path / 'genhook.db'}"
    engine = create_engine(url)

    def upgrade(revision: str) -> None:
        with engine.begin() as connection:
            config = alembic_config(url)
            config.attributes["connection"] = connection
            command.upgrade(config, revision)

    upgrade("0013")
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO accounts (id, name, signing_secret, created_at) "
                "VALUES ('a', 'a', 's', 0)"
            )
        )
        connection.execute(
            text(
                "INSERT INTO tasks (id, account_id, model, kind, status, params, inputs, "
                "created_at, updated_at, available_at, deadline_at, attempts, lease_losses, "
                "outputs, has_nsfw_contents, info, charge, trace_context) VALUES "
                "('t', 'a', 'm', 'image', 'completed', '{}', '[]', 0, 0, 0, 0, 1, 0, '[]', "
                "'[]', '{}', '{}', :parent)"
            ),
            {"parent": parent},
        )
        for delivery, status in (("d1", "pending"), ("d2", "delivered")):
            connection.execute(
                text(
                    "INSERT INTO webhook_deliveries (id, task_id, account_id, url, event_type, "
                    "body, status, attempts, round_start, redeliveries, created_at, updated_at) "
                    "VALUES (:id, 't', 'a', 'http://x/', :event, x'7b7d', :status, 0, 0, 0, 0, 0)"
                ),
                {"id": delivery, "status": status, "event": f"image.task.{delivery}"},
            )
    upgrade("head")
    with engine.connect() as connection:
        rows = dict(
            connection.execute(text("SELECT id, trace_context FROM webhook_deliveries")).all()
        )
    engine.dispose()
    assert rows == {"d1": parent, "d2": None}


def test_the_newest_revision_is_alembics_single_head() -> None:
    """A role checks its schema against ``newest_revision`` (no Alembic import): it must be
    the one head Alembic would migrate to."""
    from alembic.script import ScriptDirectory

    heads = ScriptDirectory.from_config(alembic_config("sqlite://")).get_heads()
    assert heads == [newest_revision()]


def test_schema_problem_names_where_the_database_stands(tmp_path: Path) -> None:
    path = tmp_path / "roles.db"
    url = f"sqlite+aiosqlite:///{path}"
    assert schema_problem(url) == f"the database {path} does not exist"
    sqlite3.connect(path).close()
    assert schema_problem(url) == (
        f"the database schema is not the newest (at none, newest {newest_revision()})"
    )
    upgrade_in_thread(url)
    assert schema_problem(url) is None
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE alembic_version SET version_num = '0012'")
    assert schema_problem(url) == (
        f"the database schema is not the newest (at 0012, newest {newest_revision()})"
    )


@pytest.mark.postgres
def test_schema_problem_on_postgresql(pg_url: str) -> None:
    assert "at none" in str(schema_problem(pg_url))
    upgrade_in_thread(pg_url)
    assert schema_problem(pg_url) is None
