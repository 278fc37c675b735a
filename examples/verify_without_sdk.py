"""Verify a genhook webhook without the genhook SDK: `cryptography` plus the standard library."""

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def verify_delivery(
    headers: Mapping[str, str],
    raw_body: bytes,
    jwks: dict[str, Any],
    hmac_secret: str | None = None,
    brand: str = "Service",
) -> dict[str, Any]:
    """Return the parsed body if the delivery is authentic; raise ValueError otherwise.

    ``headers``: a case-insensitive mapping, or a dict with lowercase names.
    ``raw_body``: the exact bytes received, before any JSON parsing.
    """

    def header(name: str) -> str | None:
        return headers.get(f"x-{brand.lower()}-webhook-{name}")

    timestamp = header("timestamp") or ""
    if not timestamp.isdigit() or abs(time.time() - int(timestamp)) > 300:
        raise ValueError("timestamp missing or outside the 300 s window")
    signature = header("signature-ed25519") or header("signature") or ""
    if len(signature.rstrip("=")) == 86:  # Ed25519: preferred
        jwk = next((k for k in jwks["keys"] if k["kid"] == header("key-id")), None)
        if jwk is None:
            raise ValueError("unknown key id: fetch the JWKS again (once), then retry")
        key = Ed25519PublicKey.from_public_bytes(b64url_decode(jwk["x"]))
        try:
            key.verify(b64url_decode(signature.rstrip("=")), timestamp.encode() + b"." + raw_body)
        except InvalidSignature:
            raise ValueError("Ed25519 signature mismatch") from None
    elif hmac_secret is not None:  # legacy HMAC over the raw body only
        expected = hmac.new(hmac_secret.encode(), raw_body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected.encode(), signature.encode()):
            raise ValueError("HMAC signature mismatch")
    else:
        raise ValueError("no signature this receiver can check")
    event: dict[str, Any] = json.loads(raw_body)
    if event.get("session_id") != header("id"):
        raise ValueError("header id differs from the body's session_id")
    return event
