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
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from genhook.api.bodies import ClientGone
from genhook.errors import FieldError, GenhookError, ServiceUnavailable, TooManyRequests
from genhook.faults import RETRY_AFTER_SECONDS, fault_cause, is_infrastructure_error

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
# The submit paths also push back (limits) and refuse a reused Idempotency-Key.
SUBMIT_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    403: {
        "model": ErrorResponse,
        "description": "priority is above the API key's bound (errors names priority).",
    },
    409: {"model": ErrorResponse, "description": "Idempotency-Key reused with another body."},
    429: {"model": ErrorResponse, "description": "Over a limit; see the Retry-After header."},
}


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(request: Request) -> str:
    """Every method the request's path accepts, for a 405's ``Allow``: the router answers
    with the methods of the first route that matched the path, not of all of them."""
    routes = request.app.router.routes
    # A fresh scope per method: the request's own carries the router's state of its match.
    path = {"type": "http", "path": request.scope["path"], "root_path": request.scope["root_path"]}
    return ", ".join(
        method
        for method in _METHODS
        if any(route.matches({**path, "method": method})[0] == Match.FULL for route in routes)
    )


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(GenhookError)
    async def _genhook(_: Request, exc: GenhookError) -> JSONResponse:
        headers = None
        if isinstance(exc, TooManyRequests | ServiceUnavailable):
            headers = {"Retry-After": str(exc.retry_after)}
        elif exc.status_code == 503:
            headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
        return error_response(exc.status_code, exc.message, exc.errors, headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        from genhook.tasks.submission import field_path
        from genhook.validation import describe

        errors = []
        for e in exc.errors():
            path = field_path(tuple(e["loc"][1:]) or tuple(e["loc"]))
            errors.append(FieldError(path, describe(path, e["type"], e.get("ctx"), e["msg"])))
        return error_response(400, "the request is invalid", errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        if exc.status_code == 404 and message == "Not Found":
            message = "no such endpoint"
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            if message == "Method Not Allowed":
                message = f"{request.method} is not allowed on this endpoint"
            headers["Allow"] = allowed_methods(request)
        return error_response(exc.status_code, message, headers=headers)

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

    async def _infrastructure(request: Request, exc: Exception) -> JSONResponse:
        if not is_infrastructure_error(exc):
            return await _unexpected(request, exc)
        # The database or the disk, not the request: the client should simply retry.
        log.warning("%s %s: service unavailable: %s", request.method, request.url.path, exc)
        message = f"the service is temporarily unavailable ({fault_cause(exc)}); retry shortly"
        response = error_response(503, message)
        response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response

    for kind in (SQLAlchemyError, OSError):
        app.add_exception_handler(kind, _infrastructure)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        if is_infrastructure_error(exc):
            return await _infrastructure(request, exc)
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal error; the details are in the service log")
