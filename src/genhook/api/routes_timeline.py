"""A task's timeline: when it was created, started and ended, and how often its run was lost.

Kept out of the result, whose shape the wire contract fixes; operators and the console read
it to see why a task took long (lease losses are workers that died or stalled mid-run).
"""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from genhook.api.deps import AccountDep, StateDep
from genhook.api.errors import ERROR_RESPONSES
from genhook.errors import NotFound
from genhook.task_states import polled_status
from genhook.tasks.store.reads import owned_task
from genhook.tasks.views import iso_ms

router = APIRouter(tags=["tasks"])


class Timeline(BaseModel):
    id: str
    status: str
    created_at: str
    started_at: str | None = Field(description="When the latest run started.")
    ended_at: str | None
    deadline_at: str
    attempts: int = Field(description="Runs started, counting the one after each lease loss.")
    lease_losses: int = Field(description="Runs lost because their worker stopped renewing.")
    outputs_expire_at: str | None
    outputs_deleted_at: str | None


def _iso(value: int | None) -> str | None:
    return iso_ms(value) if value is not None else None


@router.get(
    "/api/v1/model/result/{request_id}/timeline",
    response_model=Timeline,
    responses=ERROR_RESPONSES,
    summary="When the task was created, started and ended, and its lease losses",
)
async def get_timeline(request_id: str, state: StateDep, account: AccountDep) -> Timeline:
    task = await owned_task(state.db, account.id, request_id)
    if task is None:
        raise NotFound(f"no task {request_id!r}")
    return Timeline(
        id=task.id,
        status=polled_status(task.status),
        created_at=iso_ms(task.created_at),
        started_at=_iso(task.started_at),
        ended_at=_iso(task.finished_at),
        deadline_at=iso_ms(task.deadline_at),
        attempts=task.attempts,
        lease_losses=task.lease_losses,
        outputs_expire_at=_iso(task.outputs_expire_at),
        outputs_deleted_at=_iso(task.outputs_purged_at),
    )
