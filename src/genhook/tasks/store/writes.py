"""The store's writes besides claims and terminal transitions: a submit's rows (the one
insert path), the requeues of the lease machinery, retention's deletions, and the rows of the
database blob store.

Each runs in the caller's transaction (a driver ``Tx``, an ORM session, or for large values
on SQLite the thread writer's connection, ``genhook.db.thread_writes``); the caller commits
and announces wake-ups.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from sqlalchemy import Connection, Table, delete, func, insert, literal_column, update
from sqlalchemy import select as sql_select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.schema import ScalarElementColumnDefault

from genhook.db import Blob, IdempotencyKey, Task
from genhook.db.driver import Tx
from genhook.db.thread_writes import LARGE_VALUE_BYTES, PIECE_BYTES
from genhook.db.upsert import upsert
from genhook.statuses import TaskStatus
from genhook.task_states import ACTIVE

_tasks = cast(Table, Task.__table__)
_blobs = cast(Table, Blob.__table__)
_keys = cast(Table, IdempotencyKey.__table__)

TASK_COLUMNS = [column.key for column in _tasks.columns]
# The scalar defaults of the columns that have one, which the ORM would fill at a flush.
TASK_DEFAULTS = {
    column.key: column.default.arg
    for column in _tasks.columns
    if isinstance(column.default, ScalarElementColumnDefault)
}
INSERT_TASKS = insert(_tasks)
INSERT_BLOBS = insert(_blobs)
INSERT_KEYS = insert(_keys)


def task_values(task: Task) -> dict[str, Any]:
    """A new task's row, every column; one left unset takes its default, as at a flush."""
    values = {name: getattr(task, name) for name in TASK_COLUMNS}
    for name, default in TASK_DEFAULTS.items():
        if values[name] is None:
            values[name] = default
    return values


# -- the insert path -------------------------------------------------------------------------


async def insert_keys(tx: Tx, keys: Sequence[Mapping[str, Any]]) -> None:
    """Submits' ``Idempotency-Key`` rows; a key already taken raises ``IntegrityError``."""
    if keys:
        await tx.run_many(INSERT_KEYS, keys)


async def insert_tasks(
    tx: Tx,
    tasks: Sequence[Mapping[str, Any]],
    blobs: Sequence[Mapping[str, Any]],
    keys: Sequence[Mapping[str, Any]] = (),
) -> None:
    """New tasks (``task_values``), their input blobs and their idempotency keys: one
    multi-row INSERT per table, Core statements on the driver connection (the ORM's bulk
    insert path, and even a session's Core path, cost more CPU than the statements)."""
    await tx.run_many(INSERT_TASKS, tasks)
    if blobs:
        await tx.run_many(INSERT_BLOBS, blobs)
    await insert_keys(tx, keys)


def write_task_rows(
    connection: Connection,
    task: dict[str, Any],
    blobs: list[dict[str, Any]],
    keys: list[dict[str, Any]],
) -> None:
    """``insert_tasks`` for one submit on a synchronous SQLite connection (the thread
    writer's, for megabytes of input); a large value is written in pieces, never bound
    whole, so SQLite releases the interpreter lock while it copies."""
    connection.execute(INSERT_TASKS, [task])
    small = [blob for blob in blobs if len(blob["data"]) <= LARGE_VALUE_BYTES]
    if small:
        connection.execute(INSERT_BLOBS, small)
    for blob in blobs:
        data = blob["data"]
        if len(data) <= LARGE_VALUE_BYTES:
            continue
        connection.execute(insert(_blobs).values({**blob, "data": func.zeroblob(len(data))}))
        rowid: int = connection.execute(
            sql_select(literal_column("rowid"))
            .select_from(_blobs)
            .where(_blobs.c.key == blob["key"])
        ).scalar_one()
        raw = connection.connection.driver_connection
        assert raw is not None
        view = memoryview(data)
        with raw.blobopen("blobs", "data", rowid) as handle:
            for offset in range(0, len(data), PIECE_BYTES):
                handle.write(view[offset : offset + PIECE_BYTES])
    if keys:
        connection.execute(INSERT_KEYS, keys)


async def drop_expired_key(session: AsyncSession, account_id: str, key: str, now: int) -> int:
    """Free an ``Idempotency-Key`` past its time; returns whether one went."""
    result = await session.execute(
        delete(IdempotencyKey).where(
            IdempotencyKey.account_id == account_id,
            IdempotencyKey.key == key,
            IdempotencyKey.expires_at <= now,
        )
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


# -- requeues --------------------------------------------------------------------------------


def _requeued(available_at: int, now: int) -> dict[str, Any]:
    """The columns of a running task put back in the queue, claimable from ``available_at``."""
    return {
        "status": TaskStatus.CREATED,
        "lease_owner": None,
        "lease_expires_at": None,
        "available_at": available_at,
        "updated_at": now,
    }


async def release(
    session: AsyncSession, task_id: str, owner: str, now: int, at: int, extend_ms: int = 0
) -> int:
    """Give ``owner``'s running task back, claimable from ``at``, without a lost lease;
    ``extend_ms`` moves its deadline and start deadline on."""
    values = _requeued(at, now)
    if extend_ms > 0:
        values["deadline_at"] = Task.deadline_at + extend_ms
        values["start_deadline_at"] = Task.start_deadline_at + extend_ms  # NULL stays NULL
    result = await session.execute(
        update(Task)
        .where(Task.id == task_id, Task.status == TaskStatus.PROCESSING, Task.lease_owner == owner)
        .values(values)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


async def requeue_lost(
    session: AsyncSession, task_id: str, owner: str | None, now: int, *, expired: bool
) -> int:
    """Requeue a task whose worker is gone, counting a lost lease (``expired``: only if its
    lease has run out by ``now``)."""
    conditions = [
        Task.id == task_id,
        Task.status == TaskStatus.PROCESSING,
        Task.lease_owner == owner,
    ]
    if expired:
        conditions.append(Task.lease_expires_at < now)
    result = await session.execute(
        update(Task)
        .where(*conditions)
        .values({**_requeued(now, now), "lease_losses": Task.lease_losses + 1})
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


async def forgive_outage(
    session: AsyncSession, since: int, until: int, now: int
) -> tuple[int, int]:
    """After an outage from ``since`` to ``until``: deadlines and start deadlines that fell
    inside it move on by its length, and tasks whose lease ran out inside it are requeued
    without a lost lease. Returns (deadlines extended, tasks requeued)."""
    outage = until - since
    extended = await session.execute(
        update(Task)
        .where(Task.status.in_(ACTIVE), Task.deadline_at >= since, Task.deadline_at < until)
        .values(deadline_at=Task.deadline_at + outage, updated_at=now)
        .execution_options(synchronize_session=False)
    )
    await session.execute(
        update(Task)
        .where(
            Task.status == TaskStatus.CREATED,
            Task.start_deadline_at >= since,
            Task.start_deadline_at < until,
        )
        .values(start_deadline_at=Task.start_deadline_at + outage)
        .execution_options(synchronize_session=False)
    )
    requeued = await session.execute(
        update(Task)
        .where(
            Task.status == TaskStatus.PROCESSING,
            Task.lease_expires_at >= since,
            Task.lease_expires_at < until,
        )
        .values(_requeued(now, now))
        .execution_options(synchronize_session=False)
    )
    return int(extended.rowcount), int(requeued.rowcount)  # type: ignore[attr-defined]


# -- retention -------------------------------------------------------------------------------


async def purge_outputs(
    session: AsyncSession, task_ids: Sequence[str], input_keys: Sequence[str], now: int
) -> None:
    """Mark the tasks' outputs deleted (retention), with any input blobs left."""
    if input_keys:
        await session.execute(delete(Blob).where(Blob.key.in_(input_keys)))
    await session.execute(
        update(Task)
        .where(Task.id.in_(task_ids))
        .where(Task.outputs_purged_at.is_(None))
        .values(outputs_purged_at=now)
        .execution_options(synchronize_session=False)
    )


async def delete_tasks(session: AsyncSession, task_ids: Sequence[str]) -> None:
    """Finished tasks' rows (retention's pruning; their history goes first)."""
    await session.execute(delete(Task).where(Task.id.in_(task_ids)))


# -- the database blob store -----------------------------------------------------------------


async def put_blob(session: AsyncSession, values: Mapping[str, Any], *, postgres: bool) -> None:
    """Store a blob row, replacing one under the same key."""
    stmt = upsert(Blob, postgres=postgres).values(**values)
    stmt = stmt.on_conflict_do_update(
        index_elements=[Blob.key],
        set_={"content_type": values["content_type"], "data": values["data"]},
    )
    await session.execute(stmt)


async def delete_blob(session: AsyncSession, key: str) -> None:
    await session.execute(delete(Blob).where(Blob.key == key))
