"""The reads of ``tasks`` and ``usage_lines`` that the API and the console answer from.

Route handlers call these instead of building queries, so every statement against a task
table lives under ``tasks/`` (writes in ``submission.py``, ``lifecycle.py`` and
``retention.py``; the watcher's reads in ``watch.py``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import and_, func, or_, select

from genhook.db import Database, Task, UsageLine

# Only an id's spelling reaches the database (PostgreSQL refuses NUL in text).
ID_SPELLING = re.compile(r"[A-Za-z0-9_-]{1,64}")


async def get_task(db: Database, task_id: str) -> Task | None:
    if not ID_SPELLING.fullmatch(task_id):
        return None
    async with db.read() as session:
        return await session.get(Task, task_id)


async def owned_task(db: Database, account_id: str, task_id: str) -> Task | None:
    """The task, or None when it does not exist or belongs to another account."""
    task = await get_task(db, task_id)
    return task if task is not None and task.account_id == account_id else None


async def list_tasks(
    db: Database,
    *,
    account_id: str | None,
    statuses: Sequence[str] | None,
    model: str | None,
    since_ms: int | None,
    before: tuple[int, str] | None,
    limit: int,
) -> list[Task]:
    """Tasks newest first; ``before`` is the (created_at, id) of the last one already shown."""
    stmt = select(Task)
    if account_id is not None:
        stmt = stmt.where(Task.account_id == account_id)
    if statuses is not None:
        stmt = stmt.where(Task.status.in_(statuses))
    if model:
        stmt = stmt.where(Task.model == model)
    if since_ms is not None:
        stmt = stmt.where(Task.created_at >= since_ms)
    if before is not None:
        created, task_id = before
        stmt = stmt.where(
            or_(Task.created_at < created, and_(Task.created_at == created, Task.id < task_id))
        )
    stmt = stmt.order_by(Task.created_at.desc(), Task.id.desc()).limit(limit)
    async with db.read() as session:
        return list((await session.scalars(stmt)).all())


@dataclass(frozen=True)
class UsagePage:
    total_micros: int
    task_count: int
    lines: list[UsageLine]


async def usage_page(db: Database, account_id: str, limit: int, cursor: int | None) -> UsagePage:
    """The account's totals and up to ``limit`` usage lines with ids below ``cursor``."""
    async with db.read() as session:
        total, count = (
            await session.execute(
                select(func.coalesce(func.sum(UsageLine.amount_micros), 0), func.count()).where(
                    UsageLine.account_id == account_id
                )
            )
        ).one()
        stmt = (
            select(UsageLine)
            .where(UsageLine.account_id == account_id)
            .order_by(UsageLine.id.desc())
            .limit(limit)
        )
        if cursor is not None:
            stmt = stmt.where(UsageLine.id < cursor)
        rows = list((await session.scalars(stmt)).all())
    return UsagePage(int(total), int(count), rows)
