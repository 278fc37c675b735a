"""Client-side errors, built on the service's one hierarchy in ``genhook.errors``.

An HTTP error answer becomes the same class the server raised (``InvalidRequest`` for 400,
``NotFound`` for 404, ...), carrying the server's message and field errors, so callers catch
one set of names on both sides of the wire.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from genhook.client._credentials import MISSING_KEY_HINT
from genhook.errors import (
    Conflict,
    FieldError,
    Forbidden,
    GenhookError,
    Gone,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    TooManyRequests,
    Unauthorized,
)

if TYPE_CHECKING:
    from genhook.client._models import Prediction

_BY_STATUS: dict[int, type[GenhookError]] = {
    cls.status_code: cls
    for cls in (
        InvalidRequest,
        Unauthorized,
        Forbidden,
        NotFound,
        Conflict,
        Gone,
        PayloadTooLarge,
        TooManyRequests,
        ServiceUnavailable,
    )
}


class APIConnectionError(GenhookError):
    """The service could not be reached (after the configured retries)."""

    status_code = 0


class WaitTimeout(GenhookError):
    """``wait`` gave up before the task reached a terminal state; ``last`` is the last poll."""

    status_code = 0

    def __init__(self, message: str, last: Prediction) -> None:
        super().__init__(message)
        self.last = last


class TaskFailed(GenhookError):
    """Raised by ``Prediction.raise_for_failure`` for a ``failed``, ``timeout`` or ``canceled``
    task."""

    status_code = 0

    def __init__(self, message: str, prediction: Prediction) -> None:
        super().__init__(message)
        self.prediction = prediction
        self.error_code = prediction.error_code


def error_from_response(status: int, body: bytes) -> GenhookError:
    """Map an error answer ``{"code", "message", "errors"}`` to the matching exception.

    A body that is not the documented shape (a proxy's HTML page, say) still yields the right
    class, with the body's start as the message.
    """
    message = ""
    field_errors: list[FieldError] = []
    try:
        data: Any = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict):
        raw_message = data.get("message")
        message = raw_message if isinstance(raw_message, str) else ""
        raw_errors = data.get("errors")
        if isinstance(raw_errors, list):
            for item in raw_errors:
                if isinstance(item, dict):
                    field_errors.append(
                        FieldError(str(item.get("field", "")), str(item.get("message", "")))
                    )
    if not message:
        message = body[:200].decode("utf-8", "replace").strip() or f"HTTP {status}"
    cls = _BY_STATUS.get(status, GenhookError)
    if cls is Unauthorized:
        message = f"{message.rstrip('.')}: {MISSING_KEY_HINT}"
    exc = cls(message, field_errors)
    exc.status_code = status
    return exc
