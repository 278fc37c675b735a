"""Each public package's exported names, pinned: a change to one is a deliberate API change.

As httpx does: every name in ``__all__`` exists, none is listed twice, and every public name a
package defines or re-exports is listed, so ``from genhook.client import *`` is the whole API.
"""

from __future__ import annotations

import importlib
import types

import pytest

EXPORTS: dict[str, list[str]] = {
    "genhook.client": [
        "APIConnectionError",
        "AsyncClient",
        "Client",
        "Conflict",
        "DEFAULT_BASE_URL",
        "DedupStore",
        "DeliveryStatus",
        "EDIT_MODEL",
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
        "TERMINAL_STATUSES",
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
    ],
    "genhook.receiver": [
        "DedupStore",
        "MemoryDedupStore",
        "SQLiteDedupStore",
        "VerificationFailure",
        "WebhookEvent",
        "WebhookVerificationError",
        "WebhookVerifier",
        "parse_jwks",
        "verify_request",
        "webhook_dependency",
    ],
    "genhook.signature": [
        "STANDARD_HEADERS",
        "USER_AGENT_TEMPLATE",
        "b64url_decode",
        "b64url_encode",
        "ed25519_message",
        "header_names",
        "hmac_hex",
        "standard_message",
        "standard_secret",
        "standard_secret_key",
        "standard_v1",
    ],
    "genhook.net": [
        "AddressPolicy",
        "AddressRefused",
        "MAX_REDIRECTS",
        "MAX_URL_LENGTH",
        "MSG_INVALID",
        "MSG_NOT_HTTPS",
        "MSG_NOT_PUBLIC",
        "MSG_TOO_LONG",
        "PinnedResolver",
        "Problem",
        "Reach",
        "Resolver",
        "SystemResolver",
        "Target",
        "TargetRefused",
        "classify",
        "client_ssl_context",
        "fetch_input_image",
        "parse_target",
        "pinned_connector",
    ],
    "genhook.db": [
        "Account",
        "AccountClock",
        "AccountLimit",
        "ApiKey",
        "Base",
        "Blob",
        "Database",
        "ExpiredOutput",
        "IdempotencyKey",
        "SigningKey",
        "Task",
        "TaskEvent",
        "UsageLine",
        "WebhookAttempt",
        "WebhookDelivery",
        "WebhookDestination",
        "WebhookReplay",
        "now_ms",
    ],
    "genhook.storage": [
        "BlobStore",
        "DatabaseBlobStore",
        "FileBlobStore",
        "open_blob_store",
    ],
    "genhook.tasks": [
        "Lifecycle",
        "Submitter",
        "Worker",
        "prediction_view",
    ],
    "genhook.api": [
        "AppState",
        "build_state",
        "create_app",
    ],
    "genhook.engines.image_edit": [
        "Decor",
        "EditContext",
        "EditPlan",
        "EditingEngine",
        "FitPolicy",
        "ImageEditEngine",
        "Looks",
        "OPERATIONS",
        "Step",
        "apply_looks",
        "build_decor",
        "parse_prompt",
        "read_looks",
    ],
    "genhook.engines.media": ["FitMode"],
}


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_exported_names_are_pinned(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert len(exported) == len(set(exported)), "a name is listed twice"
    assert sorted(exported) == EXPORTS[name]
    for item in exported:
        assert hasattr(module, item), item


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_every_public_name_is_exported(name: str) -> None:
    module = importlib.import_module(name)
    public = {
        item
        for item, value in vars(module).items()
        if not item.startswith("_")
        and not isinstance(value, types.ModuleType)
        and item not in ("annotations", "TYPE_CHECKING")
    }
    assert public <= set(module.__all__), sorted(public - set(module.__all__))
