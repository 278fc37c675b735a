"""Submit, result, outputs and usage endpoints."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse

from genhook.accounts import Caller
from genhook.api.bodies import BodyLimits, large_body_slot, read_json_body
from genhook.api.deps import AccountDep, AppState, StateDep, current_caller, get_state
from genhook.api.errors import ERROR_RESPONSES, SUBMIT_ERROR_RESPONSES, ErrorResponse
from genhook.api.outputs import bucket_output
from genhook.api.ranges import ranged_response
from genhook.api.routes_watch import prefer_wait, result_response
from genhook.api.schemas import PredictionResponse, UsageResponse
from genhook.engines.edit_request import EditRequest
from genhook.errors import NotFound
from genhook.storage.blobs import BucketBlobStore, valid_key
from genhook.tasks.admission import (
    IDEMPOTENCY_HEADER,
    START_DEADLINE_HEADER,
    parse_idempotency_key,
    parse_start_deadline,
)
from genhook.tasks.retention import raise_if_expired
from genhook.tasks.store.reads import owned_task, usage_page
from genhook.tasks.views import iso_ms, prediction_view

router = APIRouter()

_SUBMIT_DOC = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": EditRequest.model_json_schema()}},
    }
}


async def _caller(request: Request) -> tuple[AppState, Caller]:
    """State and caller without FastAPI's dependency machinery, which costs more per
    request than the whole submit does; used by the two hot endpoints."""
    state = await get_state(request)
    return state, await current_caller(request, state)


def _limits(state: AppState) -> BodyLimits:
    settings = state.settings
    return BodyLimits(
        max_bytes=settings.max_body_bytes,
        max_json_bytes=settings.max_json_bytes,
        max_depth=settings.max_json_depth,
        max_containers=settings.max_json_containers,
    )


async def _read_and_submit(
    request: Request,
    state: AppState,
    caller: Caller,
    path_name: str,
    idempotency_key: str | None,
    start_deadline: float | None,
) -> Any:
    """In a frame of its own, so a large body is freed as soon as this returns or raises."""
    body = await read_json_body(request, _limits(state))
    return await state.submitter.submit(
        caller.account.id,
        path_name,
        body.value,
        idempotency_key=idempotency_key,
        start_deadline=start_deadline,
        offload=body.large,
        inline=body.inline,
        max_priority=caller.max_priority,
    )


def _submit_route(path_name: str, summary: str, doc: dict[str, Any] = _SUBMIT_DOC) -> None:
    async def endpoint(request: Request) -> Any:
        state, caller = await _caller(request)
        account = caller.account
        wait = prefer_wait(request, state.settings.wait_max_seconds)
        key = parse_idempotency_key(request.headers.get(IDEMPOTENCY_HEADER))
        start = parse_start_deadline(request.headers.get(START_DEADLINE_HEADER))
        if wait is None:
            async with large_body_slot(request):
                task = await _read_and_submit(request, state, caller, path_name, key, start)
            return JSONResponse(await prediction_view(task, state.settings, state.storage))
        # Held from before the submit, so a wait over the caps creates nothing.
        with state.held.hold(account.id, request.headers.get("authorization")) as hold:
            async with large_body_slot(request):
                task = await _read_and_submit(request, state, caller, path_name, key, start)
            return await result_response(state, task, request, hold)

    endpoint.__name__ = f"submit_{path_name}"
    router.add_api_route(
        f"/api/v1/model/{path_name}",
        endpoint,
        methods=["POST"],
        summary=summary,
        response_model=PredictionResponse,
        responses=SUBMIT_ERROR_RESPONSES,
        openapi_extra=doc,
        tags=["tasks"],
    )


_submit_route("generateImage", "Submit an image task (the image-edit model and other image models)")
_submit_route("generateVideo", "Submit a video task (also accepts the image-edit model)")
_submit_route("generateAudio", "Submit an audio task (text-to-speech, speech-to-text)")


@router.get(
    "/api/v1/model/result/{request_id}",
    response_model=PredictionResponse,
    responses=ERROR_RESPONSES,
    tags=["tasks"],
    summary="Get a task's status and result",
)
async def get_result(request_id: str, request: Request) -> Any:
    state, caller = await _caller(request)
    task = await owned_task(state.db, caller.account.id, request_id)
    if task is None:
        raise NotFound(f"no task {request_id!r}")
    return await result_response(state, task, request)


@router.get(
    "/api/v1/outputs/{key:path}",
    tags=["tasks"],
    summary="Download an output (the unguessable URL is the credential)",
    responses={
        200: {"content": {"image/jpeg": {}, "image/png": {}, "video/mp4": {}}},
        206: {"description": "One byte range of the output (HTTP Range requests)"},
        307: {"description": "A presigned URL of the output's bucket (redirect delivery)."},
        404: ERROR_RESPONSES[404],
        410: {"model": ErrorResponse, "description": "Deleted at the end of its retention."},
        416: {"model": ErrorResponse, "description": "The byte range is past the output's end."},
    },
)
async def get_output(key: str, state: StateDep, request: Request) -> Response:
    if not key.startswith("outputs/") or not valid_key(key):
        raise NotFound("no such output")
    if isinstance(state.storage, BucketBlobStore):
        return await bucket_output(state.storage, state.settings, state.db, key, request)
    blob = await state.storage.get(key)
    if blob is None:
        await raise_if_expired(state.db, key)
        raise NotFound("no such output")
    data, content_type = blob
    return ranged_response(
        data,
        content_type,
        request.headers.get("range"),
        {"Cache-Control": "private, max-age=31536000, immutable"},
    )


@router.get(
    "/api/v1/usage",
    response_model=UsageResponse,
    responses=ERROR_RESPONSES,
    tags=["billing"],
    summary="The account's billed lines and totals",
)
async def get_usage(
    state: StateDep,
    account: AccountDep,
    limit: int = Query(default=100, ge=1, le=1000),
    cursor: int | None = Query(
        default=None, ge=0, le=2**62, description="next_cursor of the last page"
    ),
) -> Any:
    page = await usage_page(state.db, account.id, limit + 1, cursor)
    rows = page.lines
    more = len(rows) > limit
    rows = rows[:limit]
    return {
        "account_id": account.id,
        "currency": "USD",
        "total_usd": usd(page.total_micros),
        "task_count": page.task_count,
        "items": [
            {
                "task_id": row.task_id,
                "model": row.model,
                "tier": row.tier,
                "output_pixels": row.output_pixels,
                "input_images": row.input_images,
                "lines": [list(line) for line in row.lines],
                "amount_usd": usd(row.amount_micros),
                "created_at": iso_ms(row.created_at),
            }
            for row in rows
        ],
        "next_cursor": rows[-1].id if more and rows else None,
    }


def usd(micros: int) -> str:
    """Micro-dollars as a plain decimal string, e.g. 33000 -> "0.033"."""
    return format((Decimal(micros) / Decimal(1_000_000)).normalize(), "f")
