"""Write transactions on the driver connection (``genhook.db.driver``): rows and JSON come
back as a session gives them, an error rolls everything back, wake-ups go out only after
the commit, a constraint violation is SQLAlchemy's ``IntegrityError``, and a PostgreSQL
connection the server dropped is let go of."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from sqlalchemy import Table, bindparam, func, insert, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError

from genhook.db import Database, Task, UsageLine, now_ms, wakeups
from genhook.db.driver import SessionTx, Tx, compiled
from genhook.db.wakeups.postgres import PostgresHub
from genhook.faults import is_infrastructure_error
from genhook.tasks.store.hot_path import INSERT_USAGE
from genhook.tasks.store.writes import TASK_DEFAULTS
from tests.support.postgres import PostgresServer
from tests.support.queued import queued_rows
from tests.support.webhook_receiver import add_account, create_schema

_tasks = cast(Table, Task.__table__)
TASK = select(_tasks).where(_tasks.c.id == bindparam("id"))
RENAME = update(_tasks).where(_tasks.c.id == bindparam("id")).values(model=bindparam("model"))
INSERT_TASK = insert(_tasks).values({column.name: bindparam(column.name) for column in _tasks.c})


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    handle = Database(database_url)
    await create_schema(handle)
    await add_account(handle)
    yield handle
    await handle.dispose()


def task_row(task_id: str, **changes: Any) -> dict[str, Any]:
    """A queued task's every column, with JSON worth a round trip (nested, not ASCII)."""
    ((row,), _) = queued_rows("acct_1", "test/m", 1, now_ms())
    row = {column.name: None for column in _tasks.c} | TASK_DEFAULTS | row
    row.update(
        id=task_id,
        params={"prompt": "façade ✓", "nested": {"list": [1, 2.5, None, True]}},
        info={"é": "ü"},
    )
    row.update(changes)
    return row


async def test_rows_and_json_come_back_as_a_session_gives_them(db: Database) -> None:
    async with db.transaction() as tx:
        await tx.run(INSERT_TASK, task_row("t-1"))
        await tx.run(INSERT_TASK, task_row("t-2", stt_result={"text": "héllo", "words": []}))
    async with db.transaction() as tx:
        assert await tx.run(RENAME, {"id": "t-1", "model": "test/n"}) == 1
        assert await tx.run(RENAME, {"id": "none", "model": "test/n"}) == 0
        driven = [await tx.first(TASK, {"id": task_id}) for task_id in ("t-1", "t-2")]
        assert await tx.first(TASK, {"id": "none"}) is None
    async with db.read() as session:
        through_session = [await SessionTx(session).first(TASK, {"id": i}) for i in ("t-1", "t-2")]
        stored = await session.get(Task, "t-1")
    assert driven == through_session
    assert driven[0] is not None and driven[0]["params"]["nested"] == {"list": [1, 2.5, None, True]}
    assert driven[0]["stt_result"] is None and driven[0]["info"] == {"é": "ü"}
    assert driven[1] is not None and driven[1]["stt_result"] == {"text": "héllo", "words": []}
    assert stored is not None and stored.model == "test/n"


async def test_run_many_writes_every_row(db: Database) -> None:
    lines = [
        {
            "account_id": "acct_1",
            "task_id": f"t-{index}",
            "model": "test/m",
            "tier": "standard",
            "output_pixels": 1,
            "input_images": 1,
            "lines": [{"item": "é", "micros": index}],
            "amount_micros": index,
            "upstream_cost_micros": None,
            "created_at": 0,
        }
        for index in range(3)
    ]
    async with db.transaction() as tx:
        await tx.run_many(INSERT_USAGE, lines)
    async with db.read() as session:
        stored = (await session.scalars(select(UsageLine).order_by(UsageLine.task_id))).all()
    assert [line.lines for line in stored] == [line["lines"] for line in lines]


async def test_an_error_rolls_the_whole_transaction_back(db: Database) -> None:
    with pytest.raises(RuntimeError):
        async with db.transaction() as tx:
            await tx.run(INSERT_TASK, task_row("t-gone"))
            raise RuntimeError("rolled back")
    async with db.transaction() as tx:  # the write lock was let go of
        await tx.run(INSERT_TASK, task_row("t-kept"))
    async with db.read() as session:
        assert (await session.scalars(select(Task.id))).all() == ["t-kept"]


async def test_a_wake_up_goes_out_after_the_commit_and_never_on_rollback(db: Database) -> None:
    woken = asyncio.Event()
    subscription = wakeups.subscribe(db.url, wakeups.DELIVERIES, woken.set, db.sqlite_path)
    try:
        hub = wakeups.hub_for(db.url)
        if db.is_postgres:
            assert isinstance(hub, PostgresHub)
            async with asyncio.timeout(10):
                await hub.connected.wait()
            await asyncio.sleep(0.2)
        woken.clear()  # a fresh LISTEN connection wakes everyone once
        with pytest.raises(RuntimeError):
            async with db.transaction() as tx:
                await tx.notify(wakeups.DELIVERIES)
                raise RuntimeError("rolled back")
        await asyncio.sleep(0.3)
        assert not woken.is_set()
        async with db.transaction() as tx:
            await tx.notify(wakeups.DELIVERIES)
            await tx.notify(wakeups.DELIVERIES)  # once per transaction
            await asyncio.sleep(0.2)
            assert not woken.is_set()  # not before the commit
        async with asyncio.timeout(5):
            await woken.wait()
    finally:
        subscription.close()


async def test_a_constraint_violation_is_sqlalchemys_integrity_error(db: Database) -> None:
    """As through a session: a submit tells a taken idempotency key apart by it."""
    async with db.transaction() as tx:
        await tx.run(INSERT_TASK, task_row("t-1"))
    for many in (False, True):
        with pytest.raises(IntegrityError):
            async with db.transaction() as tx:
                if many:
                    await tx.run_many(INSERT_TASK, [task_row("t-2"), task_row("t-1")])
                else:
                    await tx.run(INSERT_TASK, task_row("t-1"))
    async with db.read() as session:
        assert (await session.scalars(select(Task.id))).all() == ["t-1"]


def test_a_statement_rendered_anew_per_execution_is_refused() -> None:
    expanding = select(_tasks.c.id).where(_tasks.c.id.in_(bindparam("ids", expanding=True)))
    with pytest.raises(ValueError, match="rendered once"):
        compiled(expanding, Database("sqlite+aiosqlite://").write_engine.dialect)


async def _pid(tx: Tx) -> int:
    row = await tx.first(select(func.pg_backend_pid()), {})
    assert row is not None
    return int(next(iter(row.values())))


@pytest.mark.postgres
async def test_a_dropped_postgres_connection_fails_once_and_is_let_go_of(
    pg_server: PostgresServer, pg_url: str, no_idle_ping: None
) -> None:
    db = Database(pg_url, pool_size=1)
    try:
        async with db.transaction() as tx:
            first = await _pid(tx)
        pg_server.terminate(f"pid = {first}")
        with pytest.raises(Exception) as caught:
            async with db.transaction() as tx:
                await _pid(tx)
        assert is_infrastructure_error(caught.value)  # retried, or 503 to a client
        assert isinstance(caught.value, DBAPIError) and caught.value.connection_invalidated
        async with db.transaction() as tx:
            assert await _pid(tx) != first  # a fresh connection, not the dead one again
    finally:
        await db.dispose()


@pytest.mark.postgres
async def test_a_commit_on_a_dropped_connection_is_a_disconnect(
    pg_server: PostgresServer, pg_url: str
) -> None:
    # Whatever asyncpg calls the failure of a COMMIT on a closed connection, callers see
    # SQLAlchemy's disconnect, as through a session: retried, or 503 to a client.
    db = Database(pg_url, pool_size=1)
    await create_schema(db)
    await add_account(db)
    try:
        with pytest.raises(DBAPIError) as caught:
            async with db.transaction() as tx:
                await tx.run(INSERT_TASK, task_row("t-1"))
                pid = await _pid(tx)
                pg_server.terminate(f"pid = {pid}")
        assert caught.value.connection_invalidated
        assert is_infrastructure_error(caught.value)
        async with db.read() as session:
            assert (await session.scalars(select(Task.id))).all() == []
    finally:
        await db.dispose()


@pytest.mark.postgres
async def test_a_dropped_connection_has_the_pools_others_checked(
    pg_server: PostgresServer, pg_url: str, no_idle_ping: None
) -> None:
    # A restart drops every connection of the pool; one failed transaction, not one per
    # pooled connection, before the service writes again.
    db = Database(pg_url, pool_size=3)
    together = asyncio.Barrier(3)

    async def held() -> int:
        async with db.transaction() as tx:
            await together.wait()  # three connections at once
            return await _pid(tx)

    try:
        pids = set(await asyncio.gather(held(), held(), held()))
        assert len(pids) == 3
        pg_server.terminate(f"pid IN ({', '.join(map(str, pids))})")
        with pytest.raises(DBAPIError):
            async with db.transaction() as tx:
                await _pid(tx)
        for _ in range(3):
            async with db.transaction() as tx:
                assert await _pid(tx) not in pids
    finally:
        await db.dispose()
