"""What is signed, and how, in one place for the sender and the verifier.

Imports only the standard library so the SDK stays light.
"""

from __future__ import annotations

import base64
import hashlib
import hmac


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
