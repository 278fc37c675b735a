"""PostgreSQL's pooled connections are pinged only after they sat idle: a connection the
server dropped meanwhile is replaced before use, and one dropped within the idle window
fails its transaction once, as a database restart, after which the pool is fresh."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_connection

from genhook.db import database
from genhook.db.database import Database
from genhook.faults import is_infrastructure_error
from tests.support.postgres import PostgresServer

pytestmark = pytest.mark.postgres


@pytest.fixture
async def db(pg_url: str, no_idle_ping: None) -> AsyncIterator[Database]:
    """However slow the machine, a test's connection is still in its idle window when it
    is used again."""
    handle = Database(pg_url, pool_size=2)
    yield handle
    await handle.dispose()


@pytest.fixture
def pings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the driver's pings (each one a real round trip, made as before)."""
    made: list[int] = []
    ping = AsyncAdapt_asyncpg_connection.ping

    def counted(self: AsyncAdapt_asyncpg_connection) -> None:
        made.append(1)
        ping(self)

    monkeypatch.setattr(AsyncAdapt_asyncpg_connection, "ping", counted)
    return made


async def _backend(db: Database) -> int:
    async with db.write() as session:
        return int((await session.execute(text("SELECT pg_backend_pid()"))).scalar_one())


def _terminate(server: PostgresServer, pid: int) -> None:
    server.psql(f"SELECT pg_terminate_backend({pid})")


async def test_a_connection_used_within_the_idle_window_is_not_pinged(
    db: Database, pings: list[int]
) -> None:
    first = await _backend(db)  # a new connection: just connected, no ping either
    for _ in range(20):
        assert await _backend(db) == first  # the same hot connection, last in first out
    assert pings == []


async def test_an_idle_connection_is_pinged_and_replaced_when_the_server_dropped_it(
    pg_server: PostgresServer, pg_url: str, pings: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(database, "PING_AFTER_IDLE_SECONDS", 0.05)
    db = Database(pg_url, pool_size=2)
    try:
        first = await _backend(db)
        await asyncio.sleep(0.1)
        assert await _backend(db) == first  # idle, pinged, alive: kept
        assert len(pings) == 1
        _terminate(pg_server, first)
        await asyncio.sleep(0.1)
        second = await _backend(db)  # pinged, found dead, replaced: no error reaches us
        assert second != first
        assert len(pings) == 2
    finally:
        await db.dispose()


async def test_a_recent_connection_the_server_dropped_fails_once_as_a_restart(
    pg_server: PostgresServer, db: Database, pings: list[int]
) -> None:
    first = await _backend(db)
    _terminate(pg_server, first)
    for _ in range(50):  # until the server has closed it
        if not pg_server.rows(f"SELECT 1 FROM pg_stat_activity WHERE pid = {first}"):
            break
        await asyncio.sleep(0.02)
    with pytest.raises(Exception) as caught:
        await _backend(db)
    assert is_infrastructure_error(caught.value)  # retried, or 503 to a client
    assert await _backend(db) != first  # the pool let go of it: the next one is fresh
    assert pings == []
