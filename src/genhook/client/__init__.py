"""The genhook SDK: the API client and the webhook receiver toolkit.

Needs only httpx and cryptography; ``genhook.receiver`` re-exports the receiver half.
"""

from genhook.client._client import EDIT_MODEL, AsyncClient, Client
from genhook.client._credentials import DEFAULT_BASE_URL
from genhook.client._dedup import DedupStore, MemoryDedupStore, SQLiteDedupStore
from genhook.client._errors import APIConnectionError, TaskFailed, WaitTimeout
from genhook.client._event import (
    VerificationFailure,
    WebhookEvent,
    WebhookVerificationError,
)
from genhook.client._images import ImageInput, data_url
from genhook.client._jwks import parse_jwks
from genhook.client._models import (
    TERMINAL_STATUSES,
    LogLine,
    ModelInfo,
    Prediction,
    SttResult,
    SttSegment,
    SttWord,
    TaskEvent,
    TaskPage,
    Usage,
    UsageItem,
    lora,
)
from genhook.client._sse import SSEDecoder
from genhook.client._starlette import verify_request, webhook_dependency
from genhook.client._verifier import WebhookVerifier
from genhook.errors import (
    Conflict,
    FieldError,
    Forbidden,
    GenhookError,
    Gone,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    TooManyRequests,
    Unauthorized,
)
from genhook.priorities import Priority
from genhook.signature import standard_secret
from genhook.statuses import DeliveryStatus, TaskStatus

__all__ = [
    "DEFAULT_BASE_URL",
    "EDIT_MODEL",
    "TERMINAL_STATUSES",
    "APIConnectionError",
    "AsyncClient",
    "Client",
    "Conflict",
    "DedupStore",
    "DeliveryStatus",
    "FieldError",
    "Forbidden",
    "GenhookError",
    "Gone",
    "ImageInput",
    "InvalidRequest",
    "LogLine",
    "MemoryDedupStore",
    "ModelInfo",
    "NotFound",
    "PayloadTooLarge",
    "Prediction",
    "Priority",
    "SQLiteDedupStore",
    "SSEDecoder",
    "SttResult",
    "SttSegment",
    "SttWord",
    "TaskEvent",
    "TaskFailed",
    "TaskPage",
    "TaskStatus",
    "TooManyRequests",
    "Unauthorized",
    "Usage",
    "UsageItem",
    "VerificationFailure",
    "WaitTimeout",
    "WebhookEvent",
    "WebhookVerificationError",
    "WebhookVerifier",
    "data_url",
    "lora",
    "parse_jwks",
    "standard_secret",
    "verify_request",
    "webhook_dependency",
]
