"""One error hierarchy for the whole service.

``GenhookError`` subclasses carry an HTTP status so the API layer can render any of them
with the one documented JSON error shape; ``TaskFailure`` carries a numeric ``error_code``
that ends a task as ``failed`` and is published in ``docs/api.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


@dataclass(frozen=True, slots=True)
class FieldError:
    """One problem with one request field; ``field`` is a path such as ``images[3]``."""

    field: str
    message: str


class GenhookError(Exception):
    """Base of every error the API renders as ``{"code", "message", "errors"}``."""

    status_code: int = 500

    def __init__(self, message: str, errors: list[FieldError] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.errors = list(errors or [])


class InvalidRequest(GenhookError):
    status_code = 400


class Unauthorized(GenhookError):
    status_code = 401


class NotFound(GenhookError):
    status_code = 404


class Conflict(GenhookError):
    status_code = 409


class PayloadTooLarge(GenhookError):
    status_code = 413


class TooManyRequests(GenhookError):
    status_code = 429


class ServiceUnavailable(GenhookError):
    status_code = 503


class ErrorCode(IntEnum):
    """Numeric ``error_code`` values of failed and timed-out tasks.

    Grouped by thousands: 1xxx input, 2xxx moderation, 3xxx engine, 4xxx platform.
    """

    INPUT_FETCH_FAILED = 1001
    INPUT_TOO_LARGE = 1002
    INPUT_ADDRESS_REFUSED = 1003
    INPUT_UNSUPPORTED_FORMAT = 1004
    INPUT_CORRUPT = 1005
    INPUT_TOO_MANY_PIXELS = 1006
    INPUT_TOO_COSTLY = 1007

    MODERATION_PROMPT_BLOCKED = 2001
    MODERATION_NSFW_INPUT = 2002

    PROMPT_NOT_UNDERSTOOD = 3001
    INSTRUCTION_INVALID = 3002
    ENGINE_ERROR = 3099

    WORKER_LOST = 4001
    TIMEOUT = 4002
    INTERNAL_ERROR = 4003


ERROR_CODE_DESCRIPTIONS: dict[ErrorCode, str] = {
    ErrorCode.INPUT_FETCH_FAILED: "An input image URL could not be fetched (HTTP error, "
    "connection error or timeout).",
    ErrorCode.INPUT_TOO_LARGE: "An input image is larger than the configured byte cap.",
    ErrorCode.INPUT_ADDRESS_REFUSED: "An input image URL points at an address the target-"
    "address policy refuses (private, loopback, link-local, ...).",
    ErrorCode.INPUT_UNSUPPORTED_FORMAT: "An input image is not one of JPEG, PNG, WEBP, BMP, "
    "TIFF, GIF, HEIC, HEIF.",
    ErrorCode.INPUT_CORRUPT: "An input image is truncated or cannot be decoded.",
    ErrorCode.INPUT_TOO_MANY_PIXELS: "An input image declares more pixels than the "
    "decompression-bomb limit; refused before decoding.",
    ErrorCode.INPUT_TOO_COSTLY: "An input needs more decoding work than allowed (for "
    "example a progressive JPEG with more scans than the limit); refused before decoding.",
    ErrorCode.MODERATION_PROMPT_BLOCKED: "The prompt contains a term the moderation policy blocks.",
    ErrorCode.MODERATION_NSFW_INPUT: "An input image was classified NSFW and the moderation "
    "policy rejects NSFW inputs.",
    ErrorCode.PROMPT_NOT_UNDERSTOOD: "The prompt names no operation the engine supports; the "
    "message lists the supported operations.",
    ErrorCode.INSTRUCTION_INVALID: "An instruction cannot be applied (for example it names "
    "image 3 of a two-image task).",
    ErrorCode.ENGINE_ERROR: "The engine failed unexpectedly.",
    ErrorCode.WORKER_LOST: "The worker running the task stopped responding more times than "
    "the configured lease-loss limit.",
    ErrorCode.TIMEOUT: "The task did not finish before its model's deadline.",
    ErrorCode.INTERNAL_ERROR: "An unexpected error in the service.",
}


class TaskFailure(Exception):
    """Ends a task as ``failed`` with a documented code and a human-readable message."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{int(code)}: {message}")
        self.code = code
        self.message = message
