"""On PostgreSQL a claim walks the queue's index in order and stops at the first free row,
however stale the planner's statistics: a fresh table with a backlog of thousands is the case
where, left to itself, the planner scans and sorts every queued row for each claim."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from sqlalchemy import Table, insert, text
from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect

from genhook.accounts import create_account
from genhook.db import Blob, Database, Task, now_ms
from genhook.tasks.store.hot_path import claim_candidates, claim_fair, claim_params
from tests.support.migrated import migrate
from tests.support.queued import queued_rows

pytestmark = pytest.mark.postgres

MODEL = "test/queue"
BACKLOG = 6000


@pytest.fixture
async def backlog(pg_url: str) -> AsyncIterator[Database]:
    """A freshly migrated database (never analyzed) holding a backlog, opened as a worker
    opens it."""
    migrate(pg_url)
    db = Database(pg_url, claims=True)
    account = await create_account(db, "queue")
    tasks, blobs = queued_rows(account.account_id, MODEL, BACKLOG, now_ms() - BACKLOG)
    async with db.write() as session:
        connection = await session.connection()
        await connection.execute(insert(cast(Table, Task.__table__)), tasks)
        await connection.execute(insert(cast(Table, Blob.__table__)), blobs)
    yield db
    await db.dispose()


def _plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes.extend(_plan_nodes(child))
    return nodes


async def _explain(db: Database, statement: Any, params: dict[str, Any]) -> dict[str, Any]:
    """The plan of ``statement`` run as a worker's connection runs it (rolled back)."""
    compiled = statement.compile(dialect=asyncpg_dialect())
    values = compiled.construct_params(params)
    assert compiled.positiontup is not None
    args = [values[name] for name in compiled.positiontup]
    async with db.write() as session:
        connection = await session.connection()
        raw = (await connection.get_raw_connection()).driver_connection
        assert raw is not None
        explained = await raw.fetchval(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + str(compiled), *args
        )
        await session.rollback()  # EXPLAIN ANALYZE took the row's lock: give it back
    # The connection decodes JSON itself (SQLAlchemy's codec); a bare asyncpg one would not.
    document = json.loads(explained) if isinstance(explained, str) else explained
    return cast(dict[str, Any], document[0]["Plan"])


async def test_a_claim_reads_the_head_of_the_backlog_not_all_of_it(
    backlog: Database,
) -> None:
    models = (MODEL,)
    params = {**claim_params(models, "w-plan", now_ms(), 30_000, {}), "limit": 1}
    plan = await _explain(backlog, claim_candidates(models), params)
    kinds = [node["Node Type"] for node in _plan_nodes(plan)]
    assert "Sort" not in kinds and "Bitmap Heap Scan" not in kinds, kinds
    scans = [node for node in _plan_nodes(plan) if node["Node Type"] == "Index Scan"]
    assert scans and scans[0]["Index Name"] == "ix_tasks_status_available"
    assert scans[0]["Actual Rows"] <= 2  # stopped at the head, of 6,000 queued
    assert plan["Shared Hit Blocks"] + plan.get("Shared Read Blocks", 0) < 40


async def test_a_fair_claim_reads_the_head_accounts_first_task_not_all_of_them(
    backlog: Database,
) -> None:
    """The head account's best task comes off ``ix_tasks_account_queue`` in order: the
    backlog is all one account's, so a sort would read all 6,000. (Analyzed first: on a
    table never analyzed the planner may still sort the head's pick.)"""
    models = (MODEL,)
    async with backlog.write() as session:
        await session.execute(text("ANALYZE tasks"))
    plan = await _explain(
        backlog, claim_fair(models), claim_params(models, "w-plan", now_ms(), 30_000, {})
    )
    nodes = _plan_nodes(plan)
    summary = [(node["Node Type"], node.get("Index Name"), node["Actual Rows"]) for node in nodes]
    assert "Sort" not in [kind for kind, _, _ in summary], summary
    scans = {
        node["Index Name"]: node["Actual Rows"]
        for node in nodes
        if node["Node Type"] == "Index Scan"
    }
    assert scans.get("ix_tasks_status_tag") == 1, scans
    assert scans.get("ix_tasks_account_queue") == 1, scans
    assert plan["Shared Hit Blocks"] + plan.get("Shared Read Blocks", 0) < 60


async def test_only_the_claiming_roles_plan_without_bitmap_scans(pg_url: str) -> None:
    for claims, expected in ((True, "off"), (False, "on")):
        db = Database(pg_url, claims=claims)
        try:
            async with db.read() as session:
                setting = (await session.execute(text("SHOW enable_bitmapscan"))).scalar_one()
            assert setting == expected
        finally:
            await db.dispose()
