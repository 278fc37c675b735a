"""Callbacks from upstream queues (docs/engines/upstream.md).

No API key: the URL carries a random per-task token that only the worker waiting on the task
wrote down, and a callback is accepted once. The worker reads the body and ends the task.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from genhook.api.bodies import BodyLimits, read_json_body
from genhook.api.deps import get_state
from genhook.api.errors import ERROR_RESPONSES
from genhook.engines.upstream import store_callback
from genhook.errors import FieldError, InvalidRequest, NotFound

router = APIRouter(tags=["upstream"])

# Queue callbacks are small JSON documents; outputs come as URLs or in later fetches.
MAX_CALLBACK_BYTES = 8 * 1024 * 1024


@router.post(
    "/api/v1/upstream/callback/{task_id}/{token}",
    summary="Receive an upstream queue's completion callback (token in the URL, no API key)",
    responses=ERROR_RESPONSES,
)
async def upstream_callback(task_id: str, token: str, request: Request) -> Any:
    state = await get_state(request)
    cap = min(MAX_CALLBACK_BYTES, state.settings.max_body_bytes)
    limits = BodyLimits(
        max_bytes=cap,
        max_json_bytes=cap,
        max_depth=state.settings.max_json_depth,
        max_containers=10_000,
        allow_data_urls=False,
    )
    body = (await read_json_body(request, limits)).value
    try:
        # NaN and Infinity parse in Python but are not JSON; PostgreSQL would refuse them.
        json.dumps(body, allow_nan=False)
    except ValueError:
        message = "the request body holds NaN or Infinity, which JSON does not allow"
        raise InvalidRequest(message, [FieldError("body", message)]) from None
    if not await store_callback(state.db, task_id, token, body):
        raise NotFound("no upstream job is waiting for this callback")
    return JSONResponse({"received": True})
