"""Delivery headers and signatures, made fresh for each attempt.

``migration`` (default) sends the HMAC in ``X-<Brand>-Webhook-Signature`` and the Ed25519
signature in ``...-Signature-Ed25519``; ``ed25519`` retires HMAC and sends the Ed25519
signature in both headers. What is signed lives in ``genhook.client._signature``, shared
with the SDK verifier.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Literal, Protocol

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
        stamp = str(timestamp)
        signature = key.private_key.sign(ed25519_message(stamp, body))
        return self._assemble(session_id, event_type, body, stamp, key.kid, signature, hmac_secret)

    async def sign_many(
        self,
        key: ActiveKey,
        timestamp: int,
        deliveries: Sequence[Signable],
        executor: Executor | None = None,
    ) -> list[dict[str, str]]:
        """Headers for a batch of deliveries. With an ``executor`` the Ed25519 signatures
        are made there in one call, overlapping with the event loop's other work."""
        stamp = str(timestamp)
        messages = [ed25519_message(stamp, d.body) for d in deliveries]
        if executor is None:
            signatures = sign_all(key, messages)
        else:
            loop = asyncio.get_running_loop()
            signatures = await loop.run_in_executor(executor, sign_all, key, messages)
        return [
            self._assemble(d.task_id, d.event_type, d.body, stamp, key.kid, sig, d.secret)
            for d, sig in zip(deliveries, signatures, strict=True)
        ]

    def _assemble(
        self,
        session_id: str,
        event_type: str,
        body: bytes,
        stamp: str,
        kid: str,
        ed25519_signature: bytes,
        hmac_secret: str | None,
    ) -> dict[str, str]:
        names = self._names
        ed25519 = b64url_encode(ed25519_signature)
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
            names["key_id"]: kid,
        }


class Signable(Protocol):
    @property
    def task_id(self) -> str: ...
    @property
    def event_type(self) -> str: ...
    @property
    def body(self) -> bytes: ...
    @property
    def secret(self) -> str | None: ...


def sign_all(key: ActiveKey, messages: Sequence[bytes]) -> list[bytes]:
    """Ed25519 signatures of ``messages``. The signing call releases the GIL, so a thread
    running this overlaps with the event loop; the rest of the headers stay on the loop."""
    sign = key.private_key.sign
    return [sign(message) for message in messages]
