"""Delivery headers and signatures, made fresh for each attempt.

``migration`` (default) sends the HMAC in ``X-<Brand>-Webhook-Signature`` and the Ed25519
signature in ``...-Signature-Ed25519``; ``ed25519`` retires HMAC and sends the Ed25519
signature in both headers. What is signed lives in ``genhook.signature``, shared
with the SDK verifier.

With Standard Webhooks on (per account, or ``webhook_standard_headers``), ``webhook-id``
(the delivery id, the same for every retry), ``webhook-timestamp`` and ``webhook-signature``
are added: ``v1a,<base64 Ed25519>`` with the same key, and while HMAC is on also
``v1,<base64 HMAC-SHA256>`` with the account secret's bytes. The contract's headers stay
exactly as they are.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Literal, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from nacl.bindings import crypto_sign, crypto_sign_seed_keypair
from nacl.bindings import crypto_sign_BYTES as SIGNATURE_BYTES

from genhook.sender.keys import ActiveKey
from genhook.signature import (
    USER_AGENT_TEMPLATE,
    b64url_encode,
    ed25519_message,
    header_names,
    hmac_hex,
    standard_message,
    standard_secret_key,
    standard_v1,
)

SigningMode = Literal["migration", "ed25519"]


class HeaderSigner:
    def __init__(
        self, brand: str = "Service", mode: SigningMode = "migration", standard: bool = False
    ) -> None:
        self.brand = brand
        self.mode = mode
        self.standard = standard
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
        (signature,) = sign_all(key, [ed25519_message(stamp, body)])
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
        standard = [i for i, d in enumerate(deliveries) if self._standard(d)]
        messages += [
            standard_message(deliveries[i].id, stamp, deliveries[i].body) for i in standard
        ]
        if executor is None:
            signatures = sign_all(key, messages)
        else:
            loop = asyncio.get_running_loop()
            signatures = await loop.run_in_executor(executor, sign_all, key, messages)
        headers = [
            self._assemble(d.task_id, d.event_type, d.body, stamp, key.kid, sig, d.secret)
            for d, sig in zip(deliveries, signatures, strict=False)
        ]
        for i, signature in zip(standard, signatures[len(deliveries) :], strict=True):
            d = deliveries[i]
            headers[i].update(self._standard_headers(d.id, stamp, d.body, signature, d.secret))
        return headers

    def _standard(self, delivery: Signable) -> bool:
        return self.standard if delivery.standard is None else delivery.standard

    def _standard_headers(
        self, webhook_id: str, stamp: str, body: bytes, signature: bytes, secret: str | None
    ) -> dict[str, str]:
        """Standard Webhooks headers; ``v1`` only while HMAC is on."""
        signatures = []
        if self.mode == "migration" and secret is not None:
            message = standard_message(webhook_id, stamp, body)
            signatures.append("v1," + standard_v1(standard_secret_key(secret), message))
        signatures.append("v1a," + base64.b64encode(signature).decode("ascii"))
        return {
            "webhook-id": webhook_id,
            "webhook-timestamp": stamp,
            "webhook-signature": " ".join(signatures),
        }

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
    def id(self) -> str: ...
    @property
    def standard(self) -> bool | None: ...
    @property
    def task_id(self) -> str: ...
    @property
    def event_type(self) -> str: ...
    @property
    def body(self) -> bytes: ...
    @property
    def secret(self) -> str | None: ...


def sign_all(key: ActiveKey, messages: Sequence[bytes]) -> list[bytes]:
    """Ed25519 signatures of ``messages``, made with libsodium: a third cheaper than the
    same signature through ``cryptography``, and the call releases the GIL, so a thread
    running this overlaps with the event loop; the rest of the headers stay on the loop.
    Ed25519 is deterministic: the signatures are byte for byte those of ``cryptography``."""
    secret = _sodium_secret(key)
    return [crypto_sign(message, secret)[:SIGNATURE_BYTES] for message in messages]


# libsodium's secret key (seed and public key) per key id, beside the key object it was
# made from (a key id names one key, but tests and tools may reuse one); keys change rarely.
_sodium_secrets: dict[str, tuple[Ed25519PrivateKey, bytes]] = {}


def _sodium_secret(key: ActiveKey) -> bytes:
    entry = _sodium_secrets.get(key.kid)
    if entry is not None and entry[0] is key.private_key:
        return entry[1]
    seed = key.private_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    if len(_sodium_secrets) >= 16:
        _sodium_secrets.clear()
    secret = crypto_sign_seed_keypair(seed)[1]
    _sodium_secrets[key.kid] = (key.private_key, secret)
    return secret
