"""Schema migrations (Alembic), run by ``genhook db upgrade`` and at ``genhook serve`` start.

On SQLite an exclusive file lock serializes concurrent starts; on PostgreSQL an advisory
lock does, so several replicas may start at once against one database.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, create_engine, inspect, text
from sqlalchemy.engine import make_url

from genhook.files import private_sqlite

if TYPE_CHECKING:
    from alembic.config import Config

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).parent / "migrations"
_PG_LOCK_ID = 0x6E686B  # arbitrary, fixed: "genhook migrations"


def alembic_config(url: str) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def _sync_url(url: str) -> str:
    parsed = make_url(url)
    driver = {"sqlite": "sqlite+pysqlite", "postgresql": "postgresql+psycopg2"}
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        # asyncpg is the only PostgreSQL driver we install; run it through the async env.
        return url
    return parsed.set(drivername=driver.get(backend, backend)).render_as_string(hide_password=False)


def upgrade(url: str) -> None:
    """Bring the database at ``url`` to the newest schema; a no-op when it is current."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        import fcntl

        database = parsed.database or ""
        private_sqlite(database)
        lock_path = Path(f"{database}.migrate.lock")
        with lock_path.open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            engine = create_engine(_sync_url(url))
            with engine.begin() as connection:
                _upgrade_with_connection(connection, url)
            engine.dispose()
        return
    import asyncio

    asyncio.run(_upgrade_postgres(url))


async def _upgrade_postgres(url: str) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(url)
    async with engine.connect() as connection:
        await connection.execute(text(f"SELECT pg_advisory_lock({_PG_LOCK_ID})"))
        try:
            await connection.run_sync(_upgrade_with_connection, url)
            await connection.commit()
        finally:
            await connection.execute(text(f"SELECT pg_advisory_unlock({_PG_LOCK_ID})"))
            await connection.commit()
    await engine.dispose()


def _upgrade_with_connection(connection: object, url: str) -> None:
    """Upgrade on ``connection``; one line says what changed, none when nothing did."""
    from alembic import command
    from alembic.runtime.migration import MigrationContext

    config = alembic_config(url)
    config.attributes["connection"] = connection
    before = MigrationContext.configure(connection).get_current_revision()  # type: ignore[arg-type]
    command.upgrade(config, "head")
    after = MigrationContext.configure(connection).get_current_revision()  # type: ignore[arg-type]
    if after != before:
        log.info("database schema upgraded from %s to %s", before or "empty", after)


def upgrade_in_thread(url: str) -> None:
    """``upgrade`` from inside a running event loop (tests, async CLIs)."""
    import threading

    errors: list[BaseException] = []

    def _target() -> None:
        try:
            upgrade(url)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=_target)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def schema_problem(url: str) -> str | None:
    """Why the database at ``url`` is not at the newest schema, or None when it is."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ""
        if database and database != ":memory:" and not Path(database).exists():
            return f"the database {database} does not exist"
        engine = create_engine(_sync_url(url))
        try:
            with engine.connect() as connection:
                return _schema_problem(connection)
        finally:
            engine.dispose()
    import asyncio

    return asyncio.run(_schema_problem_postgres(url))


async def _schema_problem_postgres(url: str) -> str | None:
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(url)
    try:
        async with engine.connect() as connection:
            problem: str | None = await connection.run_sync(_schema_problem)
            return problem
    finally:
        await engine.dispose()


def newest_revision() -> str:
    """The newest migration's revision: its file's number, as every migration here is named.

    Read from the file names rather than by Alembic, so that a role started on its own checks
    its schema without importing Alembic (a third of a second of its start);
    ``tests/integration/test_migrations.py`` holds it equal to Alembic's single head."""
    names = (path.name for path in (MIGRATIONS / "versions").glob("[0-9][0-9][0-9][0-9]_*.py"))
    return max(name[:4] for name in names)


def _schema_problem(connection: Connection) -> str | None:
    newest = newest_revision()
    current: set[str] = set()
    if inspect(connection).has_table("alembic_version"):
        rows = connection.execute(text("SELECT version_num FROM alembic_version"))
        current = {str(row[0]) for row in rows}
    if current == {newest}:
        return None
    found = ", ".join(sorted(current)) or "none"
    return f"the database schema is not the newest (at {found}, newest {newest})"
