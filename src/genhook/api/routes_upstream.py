"""Callbacks from upstream queues (docs/engines/upstream.md).

No API key: the URL carries a random per-task token that only the worker waiting on the task
wrote down, and a callback is accepted once. The worker reads the body and ends the task.
Anyone can post here, so the task and token are checked before a byte of the body is read,
and the body gets the structure limits of a submit without its image data.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from genhook.api.bodies import BodyLimits, read_json_body
from genhook.api.deps import get_state
from genhook.api.errors import ERROR_RESPONSES
from genhook.engines.upstream import callback_waiting, store_callback
from genhook.errors import FieldError, InvalidRequest, NotFound

router = APIRouter(tags=["upstream"])


@router.post(
    "/api/v1/upstream/callback/{task_id}/{token}",
    summary="Receive an upstream queue's completion callback (token in the URL, no API key)",
    responses=ERROR_RESPONSES,
)
async def upstream_callback(task_id: str, token: str, request: Request) -> Any:
    state = await get_state(request)
    if not await callback_waiting(state.db, task_id, token):
        raise NotFound("no upstream job is waiting for this callback")
    # Queue callbacks are small JSON documents (outputs come as URLs or in later fetches):
    # the whole body is held to a submit's limits for its structure.
    settings = state.settings
    limits = BodyLimits(
        max_bytes=settings.max_json_bytes,
        max_json_bytes=settings.max_json_bytes,
        max_depth=settings.max_json_depth,
        max_containers=settings.max_json_containers,
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
