"""One JSON error shape for every failure: ``{"code", "message", "errors": [{field, message}]}``.

Validation failures are 400 (never FastAPI's default 422), and no exception reaches the
client as a bare 500 page.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from genhook.api.bodies import ClientGone
from genhook.errors import FieldError, GenhookError

log = logging.getLogger(__name__)


class FieldErrorModel(BaseModel):
    field: str
    message: str


class ErrorResponse(BaseModel):
    code: int
    message: str
    errors: list[FieldErrorModel] = []


def error_body(status: int, message: str, errors: list[FieldError] | None = None) -> dict[str, Any]:
    return {
        "code": status,
        "message": message,
        "errors": [{"field": e.field, "message": e.message} for e in errors or []],
    }


def error_response(
    status: int,
    message: str,
    errors: list[FieldError] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    if status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
    return JSONResponse(error_body(status, message, errors), status_code=status, headers=headers)


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "Invalid request; `errors` names each field."},
    401: {"model": ErrorResponse, "description": "Missing, malformed, wrong or revoked API key."},
    404: {"model": ErrorResponse, "description": "No such task for this account."},
    413: {"model": ErrorResponse, "description": "Request body over the configured cap."},
}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(GenhookError)
    async def _genhook(_: Request, exc: GenhookError) -> JSONResponse:
        return error_response(exc.status_code, exc.message, exc.errors)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        from genhook.tasks.submission import field_path

        errors = [
            FieldError(field_path(tuple(e["loc"][1:]) or tuple(e["loc"])), e["msg"])
            for e in exc.errors()
        ]
        return error_response(400, "the request is invalid", errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        if exc.status_code == 404 and message == "Not Found":
            message = "no such endpoint"
        elif exc.status_code == 405 and message == "Method Not Allowed":
            message = f"{request.method} is not allowed on this endpoint"
        # Keeps ``Allow`` on a 405.
        return error_response(exc.status_code, message, headers=dict(exc.headers or {}))

    async def _gone(request: Request, _: Exception) -> JSONResponse:
        log.info(
            "client disconnected before sending its whole body: %s %s",
            request.method,
            request.url.path,
        )
        # Nobody is left to read it.
        return error_response(400, "the client disconnected")

    app.add_exception_handler(ClientGone, _gone)
    app.add_exception_handler(ClientDisconnect, _gone)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal error; the details are in the service log")
