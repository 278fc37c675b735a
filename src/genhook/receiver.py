"""The receiver side of genhook webhooks: verify, deduplicate, plug into a web framework.

Everything here comes from the light ``genhook.client`` modules, so a receiver needs only
the bare install. The service's sending side is ``genhook.sender`` and is never imported
from here; both sides read the wire format from ``genhook.signature``.
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
