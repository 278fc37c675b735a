"""The Alembic migrations build exactly the schema the models describe, on both databases."""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.ext.asyncio import create_async_engine

from genhook.db.migrate import upgrade_in_thread
from genhook.db.models import Base


async def test_migrations_match_models(database_url: str) -> None:
    upgrade_in_thread(database_url)
    upgrade_in_thread(database_url)  # a second run is a no-op
    engine = create_async_engine(database_url)

    def diff(connection: Any) -> list[Any]:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return list(compare_metadata(context, Base.metadata))

    async with engine.connect() as connection:
        differences = await connection.run_sync(diff)
    await engine.dispose()
    assert differences == []
