"""The completion transaction of the worker's hot path, in Core statements built once.

Completing a task is the service's most frequent write. Here it costs one conditional UPDATE
of its own (which returns just the columns billing and cleanup need, not an ORM object),
while a group commit's tasks share one DELETE of their input blobs and one multi-row INSERT
of their usage lines. Full task rows are loaded only for tasks with a webhook, whose
callback renders what polling shows, in the same transaction as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Table, bindparam, delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from genhook.config import Settings
from genhook.db import Blob, Task, UsageLine
from genhook.storage import BlobStore

if TYPE_CHECKING:
    from genhook.tasks.lifecycle import Completion

_tasks = cast(Table, Task.__table__)
_blobs = cast(Table, Blob.__table__)

COMPLETE = (
    update(_tasks)
    .where(
        _tasks.c.id == bindparam("task_id"),
        _tasks.c.status == "processing",
        _tasks.c.lease_owner == bindparam("owner"),
    )
    .values(
        status="completed",
        outputs=bindparam("outputs"),
        has_nsfw_contents=bindparam("nsfw"),
        info=bindparam("info"),
        stt_result=bindparam("stt_result"),
        lease_owner=None,
        lease_expires_at=None,
        finished_at=bindparam("now"),
        updated_at=bindparam("now"),
        outputs_expire_at=bindparam("expire_at"),
    )
    .returning(
        _tasks.c.id,
        _tasks.c.account_id,
        _tasks.c.model,
        _tasks.c.inputs,
        _tasks.c.charge,
        _tasks.c.webhook_url,
    )
)
DELETE_BLOBS = delete(_blobs).where(_blobs.c.key.in_(bindparam("keys", expanding=True)))
INSERT_USAGE = insert(cast(Table, UsageLine.__table__))
WEBHOOK_TASKS = select(Task).where(Task.id.in_(bindparam("ids", expanding=True)))


def usage_row(row: Any, now: int, upstream_cost_micros: int | None) -> dict[str, Any]:
    """The usage line of a completed task (``row``: a Task or a returned row)."""
    charge = row.charge
    return {
        "account_id": row.account_id,
        "task_id": row.id,
        "model": row.model,
        "tier": charge["tier"],
        "output_pixels": charge["output_pixels"],
        "input_images": charge["input_images"],
        "lines": charge["lines"],
        "amount_micros": charge["total_micros"],
        "upstream_cost_micros": upstream_cost_micros,
        "created_at": now,
    }


async def complete_in(
    session: AsyncSession,
    settings: Settings,
    storage: BlobStore,
    worker_id: str,
    items: Sequence[Completion],
    now: int,
) -> list[bool]:
    """End ``items`` as completed in the caller's transaction; per item, whether it was still
    this worker's to end (processing under its lease)."""
    from genhook.tasks.lifecycle import enqueue_callback

    connection = await session.connection()
    expire_at = now + int(settings.output_retention.total_seconds() * 1000)
    done: list[bool] = []
    input_keys: list[str] = []
    usage: list[dict[str, Any]] = []
    webhooks: list[str] = []
    for item in items:
        row = (
            await connection.execute(
                COMPLETE,
                {
                    "task_id": item.task_id,
                    "owner": worker_id,
                    "outputs": item.outputs,
                    "nsfw": item.nsfw,
                    "info": item.info,
                    "stt_result": item.stt_result,
                    "now": now,
                    "expire_at": expire_at,
                },
            )
        ).first()
        done.append(row is not None)
        if row is None:
            continue
        input_keys += [entry["blob"] for entry in row.inputs if "blob" in entry]
        if row.charge:
            usage.append(usage_row(row, now, item.upstream_cost_micros))
        if row.webhook_url:
            webhooks.append(row.id)
    if input_keys:
        await connection.execute(DELETE_BLOBS, {"keys": input_keys})
    if usage:
        await connection.execute(INSERT_USAGE, usage)
    if webhooks:
        for task in (await session.scalars(WEBHOOK_TASKS, {"ids": webhooks})).all():
            await enqueue_callback(session, task, settings, storage, now)
    return done
