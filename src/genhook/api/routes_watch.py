"""Waiting and watching: ``Prefer: wait`` on submit and result, ``?logs=1``, the event
stream of one task and the listing of the account's tasks.

A request without ``Prefer``, ``?logs`` or ``Last-Event-ID`` gets the plain answer; the
extras cost nothing on the hot submit path unless asked for.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import re
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.datastructures import QueryParams

from genhook.api.deps import AppState, current_account, get_state
from genhook.api.errors import ERROR_RESPONSES
from genhook.api.held import HeldStream, Hold
from genhook.api.schemas import TaskListResponse
from genhook.db import Account, Task
from genhook.errors import (
    MAX_WIRE_INTEGER,
    FieldError,
    InvalidRequest,
    NotFound,
    whole_number,
    zoned_time_ms,
)
from genhook.task_states import POLLED_STATUSES, is_terminal, polled_status
from genhook.tasks.store.reads import get_task, list_tasks, owned_task
from genhook.tasks.views import prediction_view
from genhook.tasks.watch import Signature, current_signature, read_task_view, stream_step

router = APIRouter()

# A comment line this often keeps proxies from closing an idle stream.
KEEPALIVE_SECONDS = 15.0
# Event numbers are ``task_events`` ids, an INTEGER column.
MAX_EVENT_NUMBER = 2**31 - 1
_WAIT = re.compile(r"^wait(?:\s*=\s*(.*))?$", re.IGNORECASE)


def prefer_wait(request: Request, max_seconds: float) -> float | None:
    """Seconds asked for with ``Prefer: wait`` or ``Prefer: wait=N`` (capped), or None."""
    header = request.headers.get("prefer")
    if header is None:
        return None
    for preference in header.split(","):
        match = _WAIT.match(preference.split(";")[0].strip())
        if match is None:
            continue
        value = (match.group(1) or "").strip().strip('"')
        if not value:
            return max_seconds
        if not (value.isascii() and value.isdigit()):
            message = f"wait must be whole seconds (0 to {max_seconds:g}), got {value!r}"
            raise InvalidRequest(message, [FieldError("Prefer", message)])
        return min(float(value), max_seconds)
    return None


def wants_logs(request: Request) -> bool:
    value = request.query_params.get("logs")
    if value is None:
        return False
    if value.lower() in ("1", "true", "yes"):
        return True
    if value.lower() in ("0", "false", "no", ""):
        return False
    message = f"logs must be 1 or 0, got {value!r}"
    raise InvalidRequest(message, [FieldError("logs", message)])


async def wait_until_done(state: AppState, task: Task, seconds: float) -> Task:
    """The task once it has ended, or as it is when ``seconds`` run out."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    seen: Signature = await current_signature(state.db, task)
    while not is_terminal(seen[0]):
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        changed = await state.watcher.wait_change(task.id, seen, remaining)
        if changed is None:
            break
        seen = changed
    return await get_task(state.db, task.id) or task


async def result_response(
    state: AppState, task: Task, request: Request, hold: Hold | None = None
) -> JSONResponse:
    """A result, after ``Prefer: wait`` when asked, with the live fields and logs; the wait
    takes a held request's place unless the caller already has one (``hold``)."""
    wait = prefer_wait(request, state.settings.wait_max_seconds)
    logs = wants_logs(request)
    headers: dict[str, str] = {}
    if wait is not None:
        headers["Preference-Applied"] = f"wait={wait:g}"
        if not is_terminal(task.status):
            if hold is None:
                hold = state.held.hold(task.account_id, request.headers.get("authorization"))
            with hold:
                task = await wait_until_done(state, task, wait)
    view = await read_task_view(state.db, task, state.settings, state.storage, logs=logs)
    return JSONResponse(view, headers=headers)


async def _owned_task(state: AppState, account: Account, request_id: str) -> Task:
    task = await owned_task(state.db, account.id, request_id)
    if task is None:
        raise NotFound(f"no task {request_id!r}")
    return task


def _parse_event_id(value: str | None) -> tuple[str, int] | None:
    """``Last-Event-ID`` is ``<status>:<n>``: the status last sent and its last event."""
    if value is None or not value.strip():
        return None
    status, sep, number = value.strip().partition(":")
    if not sep or status not in POLLED_STATUSES or not number.isdigit():
        message = "Last-Event-ID must be an id this stream sent, such as 'processing:12'"
        raise InvalidRequest(message, [FieldError("Last-Event-ID", message)])
    return status, whole_number(number, "Last-Event-ID", high=MAX_EVENT_NUMBER)


def _sse(event_id: str, event: str, data: dict[str, Any]) -> bytes:
    body = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return f"id: {event_id}\nevent: {event}\ndata: {body}\n\n".encode()


async def event_stream(
    state: AppState, task_id: str, last: tuple[str, int] | None
) -> AsyncIterator[bytes]:
    """One event per change of the task's status or reported progress, then the terminal
    event with the full result; an event already sent (``last``) is not sent again."""
    sent = last
    while True:
        step = await stream_step(state.db, task_id, sent, state.settings, state.storage)
        if step is None:
            return
        task, newest, events = step
        for event_id, view in events:
            key = (polled_status(task.status), event_id)
            yield _sse(f"{key[0]}:{key[1]}", key[0], view)
            sent = key
        if is_terminal(task.status):
            return
        changed = await state.watcher.wait_change(task_id, (task.status, newest), KEEPALIVE_SECONDS)
        if state.watcher.closed:
            # Shutting down: the client resumes on another process with Last-Event-ID.
            return
        if changed is None:
            yield b": keep-alive\n\n"


@router.get(
    "/api/v1/model/result/{request_id}/events",
    tags=["tasks"],
    summary="A Server-Sent Events stream of the task's changes, ending after its end",
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "The event stream."},
        **ERROR_RESPONSES,
    },
)
async def get_events(request_id: str, request: Request) -> StreamingResponse:
    state = await get_state(request)
    account = await current_account(request, state)
    await _owned_task(state, account, request_id)
    last = _parse_event_id(request.headers.get("last-event-id"))
    hold = state.held.hold(account.id, request.headers.get("authorization"))
    return event_response(state, request_id, last, hold)


def event_response(
    state: AppState, task_id: str, last: tuple[str, int] | None, hold: Hold
) -> StreamingResponse:
    """The event stream as a response that holds ``hold`` until it ends."""
    return HeldStream(
        event_stream(state, task_id, last),
        hold,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _encode_cursor(task: Task) -> str:
    raw = f"{task.created_at}.{task.id}".encode()
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _decode_cursor(cursor: str) -> tuple[int, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
        created, _, task_id = raw.partition(".")
        if not task_id or len(task_id) > 64:
            raise ValueError(raw)
        return whole_number(created, "cursor"), task_id
    except (ValueError, binascii.Error, UnicodeDecodeError, InvalidRequest):
        message = "cursor must be the next_cursor of an earlier page"
        raise InvalidRequest(message, [FieldError("cursor", message)]) from None


def _since_ms(value: str) -> int:
    """``since``: Unix milliseconds, or an ISO 8601 time with a zone."""
    text = value.strip()
    return whole_number(text, "since") if text.isdigit() else zoned_time_ms(text, "since")


def _limit(value: str | None) -> int:
    if value is None:
        return 20
    return whole_number(value, "limit", low=1, high=100)


def _query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
    }


@router.get(
    "/api/v1/model/results",
    tags=["tasks"],
    summary="The account's tasks, newest first, a page at a time",
    response_model=TaskListResponse,
    responses=ERROR_RESPONSES,
    openapi_extra={
        "parameters": [
            _query("status", "Comma-separated statuses as polled.", {"type": "string"}),
            _query("model", "Only this model's tasks.", {"type": "string"}),
            _query(
                "since",
                "ISO 8601 time with a zone, or epoch ms.",
                {
                    "anyOf": [
                        {"type": "string", "format": "date-time"},
                        {"type": "integer", "minimum": 0, "maximum": MAX_WIRE_INTEGER},
                    ]
                },
            ),
            _query(
                "limit",
                "1 to 100 (default 20).",
                {"type": "integer", "minimum": 1, "maximum": 100, "default": 20},
            ),
            _query("cursor", "next_cursor of the previous page.", {"type": "string"}),
        ]
    },
)
async def list_results(request: Request) -> JSONResponse:
    state = await get_state(request)
    account = await current_account(request, state)
    return await task_listing(state, request.query_params, account.id)


async def task_listing(state: AppState, query: QueryParams, account_id: str | None) -> JSONResponse:
    """A page of tasks, newest first; ``account_id=None`` lists every account's (admins)."""
    stored: list[str] | None = None
    status = query.get("status")
    if status:
        stored = []
        for name in status.split(","):
            if name.strip() not in POLLED_STATUSES:
                message = f"status must be one of {', '.join(POLLED_STATUSES)}, got {name!r}"
                raise InvalidRequest(message, [FieldError("status", message)])
            stored += POLLED_STATUSES[name.strip()]
    since = query.get("since")
    since_ms = _since_ms(since) if since else None
    limit = _limit(query.get("limit"))
    cursor = query.get("cursor")
    before = _decode_cursor(cursor) if cursor else None
    tasks = await list_tasks(
        state.db,
        account_id=account_id if account_id is not None else query.get("account") or None,
        statuses=stored,
        model=query.get("model") or None,
        since_ms=since_ms,
        before=before,
        limit=limit + 1,
    )
    more = len(tasks) > limit
    tasks = tasks[:limit]
    items = [await prediction_view(task, state.settings, state.storage) for task in tasks]
    if account_id is None:
        for item, task in zip(items, tasks, strict=True):
            item["account_id"] = task.account_id
    return JSONResponse(
        {"items": items, "next_cursor": _encode_cursor(tasks[-1]) if more and tasks else None}
    )
