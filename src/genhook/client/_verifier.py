"""Webhook signature verification, Ed25519 and HMAC, every rule of the wire format.

Cheap checks run first (headers, timestamp window, signature shape) so a junk request costs
no key lookup; the body is parsed only after its signature checked out, from the very bytes
that were verified.
"""

from __future__ import annotations

import base64
import hmac
import json
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from genhook.client._event import (
    Scheme,
    VerificationFailure,
    WebhookEvent,
    WebhookVerificationError,
)
from genhook.client._jwks import RemoteKeys, StaticKeys
from genhook.signature import (
    ed25519_message,
    header_names,
    hmac_hex,
    standard_message,
    standard_secret_key,
    standard_v1,
)

# A 64-byte Ed25519 signature is 86 base64url characters (padding optional); an HMAC-SHA256
# is 64 hex characters. The two shapes cannot be confused, which is how a verifier tells
# which scheme ``X-...-Signature`` carries.
_ED25519_RE = re.compile(r"[A-Za-z0-9_-]{86}(==)?")
_HEX_RE = re.compile(r"[0-9a-fA-F]{64}")

Fail = VerificationFailure
# JSON bodies are UTF-8 (RFC 8259); decoding directly skips json.loads' encoding sniffing.
_decode_json = json.JSONDecoder().decode


class _Pending:
    """An Ed25519 check still waiting for its key (fetched sync or async)."""

    __slots__ = (
        "body",
        "event",
        "kid",
        "message",
        "signature",
        "standard",
        "timestamp",
        "webhook_id",
    )

    def __init__(
        self,
        kid: str,
        signature: bytes,
        message: bytes,
        body: bytes,
        timestamp: int,
        webhook_id: str,
        event: str | None,
        standard: bool = False,
    ) -> None:
        self.standard = standard
        self.kid = kid
        self.signature = signature
        self.message = message
        self.body = body
        self.timestamp = timestamp
        self.webhook_id = webhook_id
        self.event = event


class WebhookVerifier:
    """Verify deliveries from one genhook service.

    Give ``jwks_url`` (fetched and cached) or ``jwks`` (a fixed key set) for Ed25519, or
    ``hmac_secret`` alone for HMAC. A verifier that knows Ed25519 keys requires a valid
    Ed25519 signature and never falls back to HMAC: a weaker scheme must not undo a stronger
    one (an attacker who learned the HMAC secret could otherwise forge deliveries). HMAC is
    checked only by a verifier configured with ``hmac_secret`` and no keys. Deliveries that
    carry only the Standard Webhooks headers (``webhook-id``, ``webhook-timestamp``,
    ``webhook-signature``) verify too: ``v1a`` with the keys, ``v1`` with the secret.
    ``brand`` is the service's header brand (``X-<brand>-Webhook-*``). ``tolerance`` is the
    replay window in seconds; None turns the timestamp check off (only for replaying stored
    deliveries in tests). A fetched key set is kept as long as its ``Cache-Control: max-age``
    says, at most ``max_key_age`` seconds; fetches happen at most once per
    ``min_refetch_interval``. ``clock`` (epoch seconds) drives both the window and the cache.
    """

    def __init__(
        self,
        *,
        jwks_url: str | None = None,
        jwks: Mapping[str, Any] | None = None,
        hmac_secret: str | None = None,
        tolerance: float | None = 300,
        brand: str = "Service",
        min_refetch_interval: float = 30.0,
        max_key_age: float = 3600.0,
        clock: Callable[[], float] = time.time,
        http_client: httpx.Client | None = None,
        async_http_client: httpx.AsyncClient | None = None,
    ) -> None:
        if jwks_url is not None and jwks is not None:
            raise ValueError("give jwks_url or jwks, not both")
        if jwks_url is None and jwks is None and not hmac_secret:
            raise ValueError("give jwks_url, jwks or hmac_secret")
        self.keys: RemoteKeys | StaticKeys | None = None
        if jwks_url is not None:
            self.keys = RemoteKeys(
                jwks_url,
                max_age=max_key_age,
                min_refetch_interval=min_refetch_interval,
                clock=clock,
                http_client=http_client,
                async_http_client=async_http_client,
            )
        elif jwks is not None:
            self.keys = StaticKeys(jwks)
        self._hmac_key = hmac_secret
        self.tolerance = tolerance
        self.brand = brand
        self._clock = clock
        names = header_names(brand)
        self._h_id = names["id"].lower()
        self._h_event = names["event"].lower()
        self._h_timestamp = names["timestamp"].lower()
        self._h_signature = names["signature"].lower()
        self._h_signature_ed = names["signature_ed25519"].lower()
        self._h_key_id = names["key_id"].lower()
        self._display = names

    def verify(self, headers: Mapping[str, str], raw_body: bytes) -> WebhookEvent:
        """Verify one delivery; raise ``WebhookVerificationError`` on any failure.

        May fetch the key set (blocking); async code should call ``averify``.
        """
        checked = self._check(headers, raw_body)
        if isinstance(checked, WebhookEvent):
            return checked
        assert self.keys is not None  # _check returns _Pending only when keys exist
        return self._finish_ed25519(checked, self.keys.key(checked.kid))

    async def averify(self, headers: Mapping[str, str], raw_body: bytes) -> WebhookEvent:
        """``verify`` for asyncio code: a key-set fetch does not block the event loop."""
        checked = self._check(headers, raw_body)
        if isinstance(checked, WebhookEvent):
            return checked
        assert self.keys is not None
        return self._finish_ed25519(checked, await self.keys.akey(checked.kid))

    def _missing(self, key: str) -> WebhookVerificationError:
        return WebhookVerificationError(Fail.MISSING_HEADER, f"missing {self._display[key]}")

    def _timestamp(self, stamp: str, name: str) -> int:
        if not (stamp.isascii() and stamp.isdigit() and len(stamp) <= 12):
            raise WebhookVerificationError(Fail.INVALID_TIMESTAMP, f"{name} is not epoch seconds")
        timestamp = int(stamp)
        if self.tolerance is not None and abs(self._clock() - timestamp) > self.tolerance:
            raise WebhookVerificationError(
                Fail.TIMESTAMP_OUT_OF_TOLERANCE,
                f"timestamp {timestamp} is more than {self.tolerance:g} s from now",
            )
        return timestamp

    def _check(self, headers: Mapping[str, str], raw_body: bytes) -> WebhookEvent | _Pending:
        h = {k.lower(): v for k, v in headers.items()}
        webhook_id = h.get(self._h_id)
        if not webhook_id:
            if "webhook-id" in h:
                return self._check_standard(h, bytes(raw_body))
            raise self._missing("id")
        stamp = h.get(self._h_timestamp)
        if not stamp:
            raise self._missing("timestamp")
        timestamp = self._timestamp(stamp, self._display["timestamp"])
        body = bytes(raw_body)
        event = h.get(self._h_event)
        signature_ed = h.get(self._h_signature_ed)
        signature = h.get(self._h_signature)
        if self.keys is not None:
            # Prefer the -Ed25519 header; after HMAC retires, Ed25519 moves to -Signature.
            candidate = signature_ed
            if candidate is None and signature is not None and _ED25519_RE.fullmatch(signature):
                candidate = signature
            if candidate is not None:
                return self._pending(h, candidate, stamp, timestamp, body, webhook_id, event)
            if signature is not None:
                raise WebhookVerificationError(
                    Fail.NO_USABLE_SIGNATURE,
                    "the delivery carries no Ed25519 signature; a verifier with Ed25519 keys "
                    "does not accept HMAC (configure hmac_secret alone for HMAC-only)",
                )
        elif self._hmac_key is not None and signature is not None:
            if _ED25519_RE.fullmatch(signature):
                raise WebhookVerificationError(
                    Fail.NO_USABLE_SIGNATURE,
                    "the delivery is signed with Ed25519 only; give the verifier jwks_url",
                )
            if not _HEX_RE.fullmatch(signature):
                raise WebhookVerificationError(
                    Fail.MALFORMED_SIGNATURE,
                    f"{self._display['signature']} is not a hex HMAC-SHA256",
                )
            expected = hmac_hex(self._hmac_key, body).encode("ascii")
            if not hmac.compare_digest(expected, signature.lower().encode("ascii")):
                raise WebhookVerificationError(Fail.BAD_SIGNATURE, "HMAC signature mismatch")
            return self._event(body, timestamp, webhook_id, event, "hmac", None)
        if signature_ed is None and signature is None:
            raise WebhookVerificationError(
                Fail.MISSING_HEADER,
                f"missing {self._display['signature_ed25519']} and {self._display['signature']}",
            )
        have = "an HMAC secret" if self.keys is None else "Ed25519 keys"
        raise WebhookVerificationError(
            Fail.NO_USABLE_SIGNATURE,
            f"the delivery carries no signature this verifier can check (it has {have})",
        )

    def _pending(
        self,
        h: dict[str, str],
        candidate: str,
        stamp: str,
        timestamp: int,
        body: bytes,
        webhook_id: str,
        event: str | None,
    ) -> _Pending:
        kid = h.get(self._h_key_id)
        if not kid:
            raise self._missing("key_id")
        if not _ED25519_RE.fullmatch(candidate):
            raise WebhookVerificationError(
                Fail.MALFORMED_SIGNATURE, "the Ed25519 signature is not 64 bytes of base64url"
            )
        # The pattern above guarantees 86 characters, or 88 with their padding.
        signature = base64.urlsafe_b64decode(
            candidate if len(candidate) == 88 else candidate + "=="
        )
        message = ed25519_message(stamp, body)
        return _Pending(kid, signature, message, body, timestamp, webhook_id, event)

    def _check_standard(self, h: dict[str, str], body: bytes) -> WebhookEvent | _Pending:
        """The Standard Webhooks header family: ``v1a`` (Ed25519) when this verifier has
        keys, ``v1`` (HMAC over id, timestamp and body) only when it is HMAC-only."""
        webhook_id = h["webhook-id"]
        stamp = h.get("webhook-timestamp")
        if not stamp:
            raise WebhookVerificationError(Fail.MISSING_HEADER, "missing webhook-timestamp")
        timestamp = self._timestamp(stamp, "webhook-timestamp")
        listed = h.get("webhook-signature")
        if not listed:
            raise WebhookVerificationError(Fail.MISSING_HEADER, "missing webhook-signature")
        signatures: dict[str, list[str]] = {}
        for entry in listed.split():
            version, _, value = entry.partition(",")
            signatures.setdefault(version, []).append(value)
        message = standard_message(webhook_id, stamp, body)
        event = h.get(self._h_event)
        if self.keys is not None:
            ed25519 = signatures.get("v1a")
            if not ed25519:
                raise WebhookVerificationError(
                    Fail.NO_USABLE_SIGNATURE,
                    "webhook-signature has no v1a (Ed25519) signature; a verifier with "
                    "Ed25519 keys does not accept v1 (HMAC)",
                )
            kid = h.get(self._h_key_id)
            if not kid:
                raise self._missing("key_id")
            try:
                signature = base64.b64decode(ed25519[0], validate=True)
            except ValueError:
                signature = b""
            if len(signature) != 64:
                raise WebhookVerificationError(
                    Fail.MALFORMED_SIGNATURE, "the v1a signature is not 64 bytes of base64"
                )
            return _Pending(kid, signature, message, body, timestamp, webhook_id, event, True)
        assert self._hmac_key is not None  # the constructor requires keys or a secret
        expected = standard_v1(standard_secret_key(self._hmac_key), message).encode("ascii")
        for value in signatures.get("v1", []):
            if hmac.compare_digest(expected, value.encode("ascii", "replace")):
                return self._event(body, timestamp, webhook_id, event, "hmac", None, True)
        if "v1" not in signatures:
            raise WebhookVerificationError(
                Fail.NO_USABLE_SIGNATURE, "webhook-signature has no v1 (HMAC) signature"
            )
        raise WebhookVerificationError(Fail.BAD_SIGNATURE, "v1 signature mismatch")

    def _finish_ed25519(self, pending: _Pending, key: Ed25519PublicKey) -> WebhookEvent:
        try:
            key.verify(pending.signature, pending.message)
        except InvalidSignature:
            raise WebhookVerificationError(
                Fail.BAD_SIGNATURE, "Ed25519 signature mismatch"
            ) from None
        return self._event(
            pending.body,
            pending.timestamp,
            pending.webhook_id,
            pending.event,
            "ed25519",
            pending.kid,
            pending.standard,
        )

    @staticmethod
    def _event(
        body: bytes,
        timestamp: int,
        webhook_id: str,
        event: str | None,
        scheme: Scheme,
        kid: str | None,
        standard: bool = False,
    ) -> WebhookEvent:
        """``standard``: ``webhook-id`` names the delivery, not the task, so it is not
        compared with ``session_id``."""
        try:
            data = _decode_json(body.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError included
            data = None
        if not isinstance(data, dict):
            raise WebhookVerificationError(Fail.INVALID_BODY, "the body is not a JSON object")
        if not standard and data.get("session_id") != webhook_id:
            raise WebhookVerificationError(
                Fail.ID_MISMATCH, "the Webhook-Id header differs from the body's session_id"
            )
        if event is not None and data.get("event_type") != event:
            raise WebhookVerificationError(
                Fail.EVENT_MISMATCH, "the Webhook-Event header differs from the body's event_type"
            )
        return WebhookEvent.from_body(data, scheme=scheme, key_id=kid, timestamp=timestamp)
