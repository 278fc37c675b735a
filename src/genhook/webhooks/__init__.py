"""The receiver side of genhook webhooks: verify, deduplicate, plug into a web framework.

Everything here comes from the light ``genhook.client`` modules, so a receiver needs only
``pip install genhook``. The service's sending side lives in this package's other modules
and is never imported from here.
"""

from genhook.client import (
    DedupStore,
    MemoryDedupStore,
    SQLiteDedupStore,
    VerificationFailure,
    WebhookEvent,
    WebhookVerificationError,
    WebhookVerifier,
    parse_jwks,
    verify_request,
    webhook_dependency,
)

__all__ = [
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
]
