"""Canceling a task: ``POST /api/v1/model/result/{id}/cancel``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from genhook.api.deps import AccountDep, StateDep
from genhook.api.errors import ERROR_RESPONSES, ErrorResponse
from genhook.api.schemas import PredictionResponse
from genhook.errors import Conflict, FieldError, NotFound
from genhook.storage.inputs import discard_inputs
from genhook.tasks.lifecycle import Lifecycle
from genhook.tasks.views import prediction_view

router = APIRouter()


@router.post(
    "/api/v1/model/result/{request_id}/cancel",
    response_model=PredictionResponse,
    responses={
        **ERROR_RESPONSES,
        409: {"model": ErrorResponse, "description": "The task had already ended."},
    },
    tags=["tasks"],
    summary="Cancel a task that has not ended",
)
async def cancel_task(request_id: str, state: StateDep, account: AccountDep) -> Any:
    if len(request_id) > 64:
        raise NotFound(f"no task {request_id!r}")
    lifecycle = Lifecycle(state.settings, state.db, state.storage)
    ended, task = await lifecycle.cancel(request_id, account.id)
    if task is None:
        raise NotFound(f"no task {request_id!r}")
    if not ended:
        raise Conflict(
            f"task {request_id!r} already ended as {task.status}; only a task still created "
            "or processing can be canceled",
            [FieldError("status", task.status)],
        )
    await discard_inputs(state.storage, task.inputs)
    return JSONResponse(await prediction_view(task, state.settings, state.storage))
