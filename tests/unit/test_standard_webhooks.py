"""Standard Webhooks headers from the real signer, checked with the specification's reference
library (``v1``) and PyNaCl (``v1a``), and the SDK verifier's refusal to downgrade."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from dataclasses import dataclass
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from nacl.signing import VerifyKey
from standardwebhooks import Webhook
from standardwebhooks import WebhookVerificationError as StandardError

from genhook.accounts import new_signing_secret
from genhook.client import standard_secret
from genhook.receiver import VerificationFailure, WebhookVerificationError, WebhookVerifier
from genhook.sender.keys import ActiveKey, public_x
from genhook.sender.signing import HeaderSigner
from genhook.signature import b64url_decode
from tests.support.jwk import jwk

NOW = 1_760_000_000


@dataclass(frozen=True)
class Delivery:
    id: str
    task_id: str
    event_type: str
    body: bytes
    secret: str | None
    standard: bool | None


def body_for(session_id: str = "task_1") -> bytes:
    data = {
        "session_id": session_id,
        "event_type": "image.task.terminal",
        "status": "OK",
        "created_at": 1,
        "payload": {"id": session_id, "status": "completed", "model": "m", "outputs": []},
    }
    return json.dumps(data, separators=(",", ":")).encode()


async def sign(
    *deliveries: Delivery,
    mode: str = "migration",
    default: bool = False,
    private: Ed25519PrivateKey | None = None,
    now: int = NOW,
) -> tuple[Ed25519PrivateKey, list[dict[str, str]]]:
    private = private or Ed25519PrivateKey.generate()
    key = ActiveKey("k1", private)
    signer = HeaderSigner("Service", mode, default)  # type: ignore[arg-type]
    return private, await signer.sign_many(key, now, deliveries)


def verifier(private: Ed25519PrivateKey | None, **kw: Any) -> WebhookVerifier:
    kw.setdefault("clock", lambda: float(NOW))
    if private is not None:
        kw["jwks"] = {"keys": [jwk(private, "k1")]}
    return WebhookVerifier(**kw)


def standard_only(headers: dict[str, str]) -> dict[str, str]:
    """What a receiver sees if only the Standard Webhooks family (and the key id) got through."""
    keep = {"webhook-id", "webhook-timestamp", "webhook-signature", "x-service-webhook-key-id"}
    return {k: v for k, v in headers.items() if k.lower() in keep}


async def test_standard_headers_verify_with_the_reference_library_and_pynacl() -> None:
    secret = new_signing_secret()
    body = body_for()
    delivery = Delivery("whd_1", "task_1", "image.task.terminal", body, secret, True)
    now = int(time.time())  # the reference library checks the timestamp against its clock
    private, [headers] = await sign(delivery, now=now)
    assert headers["webhook-id"] == "whd_1"
    assert headers["webhook-timestamp"] == str(now)
    # The contract's headers are exactly what they are without Standard Webhooks.
    _, [plain] = await sign(
        Delivery("whd_1", "task_1", "image.task.terminal", body, secret, None),
        private=private,
        now=now,
    )
    assert {k: v for k, v in headers.items() if not k.startswith("webhook-")} == plain
    assert headers["X-Service-Webhook-Signature"] == hmac_hex(secret, body)
    # v1: the specification's reference library, with the account secret's whsec_ form.
    wh = Webhook(standard_secret(secret))
    assert wh.verify(body, headers)["session_id"] == "task_1"
    with pytest.raises(StandardError):
        wh.verify(body + b" ", headers)
    # v1a: an independent Ed25519 check over <webhook-id>.<timestamp>.<body>.
    [v1a] = [s[4:] for s in headers["webhook-signature"].split() if s.startswith("v1a,")]
    public = VerifyKey(b64url_decode(public_x(private)))
    public.verify(b"whd_1." + str(now).encode() + b"." + body, base64.b64decode(v1a))


def hmac_hex(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


async def test_ed25519_mode_sends_v1a_only_and_the_account_choice_wins() -> None:
    body = body_for()
    on = Delivery("whd_1", "task_1", "image.task.terminal", body, "whsec_x", None)
    off = Delivery("whd_2", "task_1", "image.task.terminal", body, "whsec_x", False)
    _, [headers, none] = await sign(on, off, mode="ed25519", default=True)
    assert [s.split(",")[0] for s in headers["webhook-signature"].split()] == ["v1a"]
    assert not any(k.startswith("webhook-") for k in none)


async def test_sdk_verifies_either_header_family() -> None:
    secret = new_signing_secret()
    body = body_for()
    private, [headers] = await sign(
        Delivery("whd_9", "task_1", "image.task.terminal", body, secret, True)
    )
    event = verifier(private).verify(headers, body)
    assert (event.scheme, event.session_id) == ("ed25519", "task_1")
    event = verifier(private).verify(standard_only(headers), body)
    assert (event.scheme, event.key_id, event.session_id) == ("ed25519", "k1", "task_1")
    # HMAC-only receivers check v1 with the account secret, in either form.
    for form in (secret, standard_secret(secret)):
        event = verifier(None, hmac_secret=form).verify(standard_only(headers), body)
        assert event.scheme == "hmac"
    with pytest.raises(WebhookVerificationError) as exc:
        verifier(private).verify(standard_only(headers), body + b" ")
    assert exc.value.reason is VerificationFailure.BAD_SIGNATURE
    with pytest.raises(WebhookVerificationError) as exc:
        verifier(None, hmac_secret="whsec_other").verify(standard_only(headers), body)
    assert exc.value.reason is VerificationFailure.BAD_SIGNATURE


async def test_a_verifier_with_keys_never_falls_back_to_hmac() -> None:
    """An HMAC-signed delivery (or one whose Ed25519 signature was stripped) is refused by a
    verifier that knows Ed25519 keys, even when it also holds the right secret."""
    secret = new_signing_secret()
    body = body_for()
    private, [headers] = await sign(
        Delivery("whd_9", "task_1", "image.task.terminal", body, secret, True)
    )
    stripped = {k: v for k, v in headers.items() if k != "X-Service-Webhook-Signature-Ed25519"}
    for v in (verifier(private), verifier(private, hmac_secret=secret)):
        with pytest.raises(WebhookVerificationError) as exc:
            v.verify(stripped, body)
        assert exc.value.reason is VerificationFailure.NO_USABLE_SIGNATURE
        only_v1 = dict(standard_only(headers))
        only_v1["webhook-signature"] = " ".join(
            s for s in only_v1["webhook-signature"].split() if s.startswith("v1,")
        )
        with pytest.raises(WebhookVerificationError) as exc:
            v.verify(only_v1, body)
        assert exc.value.reason is VerificationFailure.NO_USABLE_SIGNATURE
    # Configured HMAC-only, the same delivery verifies.
    assert verifier(None, hmac_secret=secret).verify(stripped, body).scheme == "hmac"
