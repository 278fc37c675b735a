"""Delivery headers and signatures (contract 5.1, 5.2, 6.2), made fresh for each attempt.

``migration`` (default) sends the HMAC in ``X-<Brand>-Webhook-Signature`` and the Ed25519
signature in ``...-Signature-Ed25519``; ``ed25519`` retires HMAC and sends the Ed25519
signature in both headers. What is signed lives in ``genhook.client._signature``, shared
with the SDK verifier.
"""

from __future__ import annotations

from typing import Literal

from genhook.client._signature import (
    USER_AGENT_TEMPLATE,
    b64url_encode,
    ed25519_message,
    header_names,
    hmac_hex,
)
from genhook.webhooks.keys import ActiveKey

SigningMode = Literal["migration", "ed25519"]


class HeaderSigner:
    def __init__(self, brand: str = "Service", mode: SigningMode = "migration") -> None:
        self.brand = brand
        self.mode = mode
        # Computed once: every attempt of every delivery uses the same names.
        self._names = header_names(brand)
        self._user_agent = USER_AGENT_TEMPLATE.format(brand=brand)

    def headers(
        self,
        *,
        session_id: str,
        event_type: str,
        body: bytes,
        timestamp: int,
        key: ActiveKey,
        hmac_secret: str | None,
    ) -> dict[str, str]:
        names = self._names
        stamp = str(timestamp)
        ed25519 = b64url_encode(key.private_key.sign(ed25519_message(stamp, body)))
        if self.mode == "migration":
            if hmac_secret is None:
                raise ValueError("migration signing needs the account's signing secret")
            signature = hmac_hex(hmac_secret, body)
        else:
            signature = ed25519
        return {
            "Content-Type": "application/json",
            "User-Agent": self._user_agent,
            names["id"]: session_id,
            names["event"]: event_type,
            names["timestamp"]: stamp,
            names["signature"]: signature,
            names["signature_ed25519"]: ed25519,
            names["key_id"]: key.kid,
        }
