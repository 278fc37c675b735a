"""Overload and readiness: refuse early with 503 rather than queue without bound.

A request over ``max_concurrent_requests`` gets 503 with ``Retry-After`` at once, before it
reads its body or waits for a database connection, so a burst cannot pile up requests that
each hold memory and then time out anyway.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send

from genhook.faults import RETRY_AFTER_SECONDS
from genhook.runtime.services import ready_problems

__all__ = ["LoadShedding", "ready_problems"]

# Paths never shed: health probes must answer precisely when the service is busy.
_EXEMPT = ("/healthz", "/readyz")


class LoadShedding:
    """Pure ASGI middleware: counts HTTP requests in progress in this process."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.active = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in _EXEMPT:
            await self.app(scope, receive, send)
            return
        if self.active >= self.limit:
            await _refuse(send, "the service is overloaded; retry shortly")
            return
        self.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1


async def _refuse(send: Send, message: str) -> None:
    body = json.dumps({"code": 503, "message": message, "errors": []}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(RETRY_AFTER_SECONDS).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
