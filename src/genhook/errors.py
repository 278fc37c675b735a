"""One error hierarchy for the whole service.

``GenhookError`` subclasses carry an HTTP status so the API layer can render any of them
with the one documented JSON error shape; ``TaskFailure`` carries a numeric ``error_code``
that ends a task as ``failed`` and is published in ``docs/api.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
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


class Forbidden(GenhookError):
    status_code = 403


class NotFound(GenhookError):
    status_code = 404


class Conflict(GenhookError):
    status_code = 409


class PayloadTooLarge(GenhookError):
    status_code = 413


class TooManyRequests(GenhookError):
    status_code = 429

    def __init__(
        self, message: str, errors: list[FieldError] | None = None, retry_after: int = 1
    ) -> None:
        super().__init__(message, errors)
        self.retry_after = max(1, retry_after)


class Gone(GenhookError):
    status_code = 410


class ServiceUnavailable(GenhookError):
    """The service cannot take the request now (its message says why); retry later."""

    status_code = 503

    def __init__(
        self, message: str, errors: list[FieldError] | None = None, retry_after: int = 1
    ) -> None:
        super().__init__(message, errors)
        self.retry_after = max(1, retry_after)


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
    INPUT_AUDIO_TOO_LONG = 1101
    INPUT_NO_SPEECH = 1102

    MODERATION_PROMPT_BLOCKED = 2001
    MODERATION_NSFW_INPUT = 2002

    PROMPT_NOT_UNDERSTOOD = 3001
    INSTRUCTION_INVALID = 3002
    UPSTREAM_REJECTED = 3010
    UPSTREAM_UNAVAILABLE = 3011
    UPSTREAM_BAD_RESPONSE = 3012
    UPSTREAM_TASK_FAILED = 3013
    UPSTREAM_OUTPUT_REFUSED = 3014
    UPSTREAM_OUTPUT_FETCH_FAILED = 3015
    ENGINE_OUT_OF_MEMORY = 3020
    MODEL_PROCESS_DIED = 3021
    ENGINE_ERROR = 3099
    LANGUAGE_UNSUPPORTED = 3101

    WORKER_LOST = 4001
    TIMEOUT = 4002
    INTERNAL_ERROR = 4003
    CANCELED = 4004


ERROR_CODE_DESCRIPTIONS: dict[ErrorCode, str] = {
    ErrorCode.INPUT_FETCH_FAILED: "An input image or audio URL could not be fetched (HTTP error, "
    "connection error or timeout).",
    ErrorCode.INPUT_TOO_LARGE: "An input image or audio file is larger than the configured "
    "byte cap.",
    ErrorCode.INPUT_ADDRESS_REFUSED: "An input image or audio URL points at an address the target-"
    "address policy refuses (private, loopback, link-local, ...).",
    ErrorCode.INPUT_UNSUPPORTED_FORMAT: "An input image is not one of JPEG, PNG, WEBP, BMP, "
    "TIFF, GIF, HEIC, HEIF; or an input audio file is not audio or video the service reads, "
    "or has no audio track.",
    ErrorCode.INPUT_CORRUPT: "An input image or audio file is truncated or cannot be decoded, "
    "or declares impossible parameters (sample rate, channels).",
    ErrorCode.INPUT_TOO_MANY_PIXELS: "An input image declares more pixels than the "
    "decompression-bomb limit; refused before decoding.",
    ErrorCode.INPUT_TOO_COSTLY: "An input needs more decoding work than allowed (for "
    "example a progressive JPEG with more scans than the limit, or a picture with one side "
    "more than 32 times the other); refused before decoding.",
    ErrorCode.INPUT_AUDIO_TOO_LONG: "An input audio file is longer than "
    "GENHOOK_STT_MAX_DURATION_SECONDS, by its header or by what it decodes to.",
    ErrorCode.INPUT_NO_SPEECH: "An input audio file is silent or holds no recognisable speech.",
    ErrorCode.MODERATION_PROMPT_BLOCKED: "The prompt contains a term the moderation policy blocks.",
    ErrorCode.MODERATION_NSFW_INPUT: "An input image was classified NSFW and the moderation "
    "policy rejects NSFW inputs.",
    ErrorCode.PROMPT_NOT_UNDERSTOOD: "The prompt names no operation the engine supports; the "
    "message lists the supported operations.",
    ErrorCode.INSTRUCTION_INVALID: "An instruction cannot be applied (for example it names "
    "image 3 of a two-image task).",
    ErrorCode.LANGUAGE_UNSUPPORTED: "The requested language is not one the configured "
    "speech-to-text model transcribes (an English-only GENHOOK_STT_MODEL_DIR).",
    ErrorCode.UPSTREAM_REJECTED: "The upstream model server refused the request (an HTTP 4xx "
    "other than 429); the message carries the upstream's own, trimmed.",
    ErrorCode.UPSTREAM_UNAVAILABLE: "The upstream model server kept answering 429 or 5xx, timed "
    "out or could not be reached until the retries or the deadline ran out.",
    ErrorCode.UPSTREAM_BAD_RESPONSE: "The upstream model server answered with something that is "
    "not the protocol's response (malformed JSON, a missing field, no outputs).",
    ErrorCode.UPSTREAM_TASK_FAILED: "The upstream queue reported the job as failed; the message "
    "carries its reason, trimmed.",
    ErrorCode.UPSTREAM_OUTPUT_REFUSED: "The upstream returned an output URL that points at an "
    "address the target-address policy refuses.",
    ErrorCode.UPSTREAM_OUTPUT_FETCH_FAILED: "An upstream output URL could not be fetched, or the "
    "output is larger than the model's byte cap.",
    ErrorCode.ENGINE_OUT_OF_MEMORY: "A local model ran out of device memory (CUDA out of "
    "memory) or cannot fit on its device; the memory was freed and the worker goes on.",
    ErrorCode.MODEL_PROCESS_DIED: "A local model's process died during the call twice (the "
    "task was run again once on a fresh one); the message says how (the signal, and a "
    "probable out-of-memory kill for SIGKILL).",
    ErrorCode.ENGINE_ERROR: "The engine failed unexpectedly.",
    ErrorCode.WORKER_LOST: "The worker running the task stopped responding more times than "
    "the configured lease-loss limit.",
    ErrorCode.TIMEOUT: "The task did not finish before its model's deadline.",
    ErrorCode.INTERNAL_ERROR: "An unexpected error in the service.",
    ErrorCode.CANCELED: "The task was canceled by its owner (status ``canceled``).",
}


class TaskFailure(Exception):
    """Ends a task as ``failed`` with a documented code and a human-readable message."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{int(code)}: {message}")
        self.code = code
        self.message = message


# The largest integer a column holds (BIGINT): larger numbers on the wire are refused as
# invalid rather than reaching the database or the interpreter's digit limit.
MAX_WIRE_INTEGER = 2**63 - 1


def whole_number(text: str, field: str, *, low: int = 0, high: int = MAX_WIRE_INTEGER) -> int:
    """``text`` as an integer from ``low`` to ``high``, or ``InvalidRequest`` naming ``field``;
    for numbers outside the body (query parameters, cursors, headers)."""
    digits = text.strip()
    if digits.isascii() and digits.isdigit() and len(digits) <= len(str(high)):
        value = int(digits)
        if low <= value <= high:
            return value
    message = f"{field} must be a whole number from {low} to {high}"
    raise InvalidRequest(message, [FieldError(field, message)])


def zoned_time_ms(text: str, field: str) -> int:
    """``text``, an ISO 8601 time with a zone (RFC 3339, the schemas' date-time, allows a
    lower-case ``t`` and ``z``), as Unix milliseconds, or ``InvalidRequest`` naming ``field``;
    a time without a zone is refused rather than guessed."""
    try:
        moment = datetime.fromisoformat(text.strip().upper().replace("Z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        message = f"{field} must be an ISO 8601 time with a zone (e.g. 2026-11-22T08:00:00Z)"
        raise InvalidRequest(message, [FieldError(field, message)])
    return int(moment.timestamp() * 1000)
