"""The webhook signature wire format, one public module for the sender and the verifier.

``genhook.sender`` signs with it and ``genhook.receiver`` (through ``genhook.client``) checks
with it, so the two can never disagree on what is signed. Imports only the standard library
so the SDK stays light.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

__all__ = [
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
]


def b64url_encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    padded = text + "=" * (-len(text) % 4)
    return base64.urlsafe_b64decode(padded.encode("ascii"))


def ed25519_message(timestamp: str, raw_body: bytes) -> bytes:
    """Ed25519 signs ``<timestamp>.<raw body>``."""
    return timestamp.encode("ascii") + b"." + raw_body


def hmac_hex(secret: str, raw_body: bytes) -> str:
    """HMAC signs the raw body only; lowercase hex."""
    return hmac.new(secret.encode("utf-8"), raw_body, hashlib.sha256).hexdigest()


def header_names(brand: str = "Service") -> dict[str, str]:
    prefix = f"X-{brand}-Webhook-"
    return {
        "id": prefix + "Id",
        "event": prefix + "Event",
        "timestamp": prefix + "Timestamp",
        "signature": prefix + "Signature",
        "signature_ed25519": prefix + "Signature-Ed25519",
        "key_id": prefix + "Key-Id",
    }


USER_AGENT_TEMPLATE = "{brand}-Webhook/1.0"


# -- Standard Webhooks (https://www.standardwebhooks.com) ----------------------------------

STANDARD_HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature")


def standard_message(webhook_id: str, timestamp: str, raw_body: bytes) -> bytes:
    """Both Standard Webhooks schemes sign ``<webhook-id>.<timestamp>.<raw body>``."""
    return webhook_id.encode("utf-8") + b"." + timestamp.encode("ascii") + b"." + raw_body


def standard_secret_key(secret: str) -> bytes:
    """The ``v1`` HMAC key: the random bytes an account secret (``whsec_`` + base64url)
    encodes; any other secret is used as its UTF-8 bytes."""
    if secret.startswith("whsec_"):
        text = secret[len("whsec_") :]
        try:
            return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except ValueError:
            pass
    return secret.encode("utf-8")


def standard_secret(secret: str) -> str:
    """The account secret in the Standard Webhooks form (``whsec_`` + standard base64),
    for the specification's libraries: ``Webhook(standard_secret(secret))``."""
    return "whsec_" + base64.b64encode(standard_secret_key(secret)).decode("ascii")


def standard_v1(key: bytes, message: bytes) -> str:
    return base64.b64encode(hmac.new(key, message, hashlib.sha256).digest()).decode("ascii")
