"""The delivery body and its per-attempt headers."""

from __future__ import annotations

import hashlib
import hmac
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from nacl.signing import VerifyKey

from genhook.sender.keys import (
    ActiveKey,
    SigningKeyError,
    decrypt_private_key,
    encrypt_private_key,
    public_x,
)
from genhook.sender.outbox import build_body, event_type_for
from genhook.sender.signing import HeaderSigner
from genhook.signature import b64url_decode
from genhook.task_states import TIMEOUT_MESSAGE
from tests.support.webhook_receiver import payload_for, terminal_task


def test_completed_body() -> None:
    task = terminal_task("t1", "https://x.test/")
    raw = build_body(task, "image.task.terminal", payload_for(task))
    body = json.loads(raw)
    assert list(body) == ["session_id", "event_type", "status", "created_at", "payload"]
    assert body["session_id"] == "t1"
    assert body["status"] == "OK"
    assert body["created_at"] == 1_700_000_000_123 and isinstance(body["created_at"], int)
    assert body["payload"]["status"] == "completed"
    assert body["payload"]["outputs"] == ["http://testserver/api/v1/outputs/out/1.jpeg"]
    assert "error_code" not in body["payload"]
    assert b": " not in raw and b", " not in raw  # compact, serialized once


def test_failed_body_carries_code_and_reason() -> None:
    task = terminal_task(
        "t2", "https://x.test/", status="failed", error_code=2001, error_message="blocked term"
    )
    body = json.loads(build_body(task, "image.task.terminal", payload_for(task)))
    assert body["status"] == "ERROR"
    assert body["error"] == "blocked term"
    assert body["payload"]["status"] == "failed"
    assert body["payload"]["error_code"] == 2001


def test_timeout_body_has_a_generic_message() -> None:
    task = terminal_task(
        "t3",
        "https://x.test/",
        status="timeout",
        error_code=4002,
        error_message="worker 7 stuck in stage 3",
    )
    body = json.loads(build_body(task, "video.task.terminal", payload_for(task)))
    assert body["status"] == "ERROR"
    assert body["error"] == TIMEOUT_MESSAGE
    assert body["payload"]["status"] == "timeout"
    assert body["payload"]["error_code"] == 4002
    assert body["event_type"] == "video.task.terminal"


def test_non_terminal_refused() -> None:
    task = terminal_task("t4", "https://x.test/", status="processing")
    with pytest.raises(ValueError):
        build_body(task, "image.task.terminal", {})


def test_event_type_follows_the_model_kind() -> None:
    assert event_type_for("image") == "image.task.terminal"
    assert event_type_for("audio") == "audio.task.terminal"


def _key() -> ActiveKey:
    return ActiveKey("key_abc", Ed25519PrivateKey.generate())


@pytest.mark.parametrize("mode", ["migration", "ed25519"])
def test_headers_are_verifiable_independently(mode: str) -> None:
    key = _key()
    body = b'{"session_id":"t1","x":"\xc3\xa9"}'
    signer = HeaderSigner("Service", mode)  # type: ignore[arg-type]
    h = signer.headers(
        session_id="t1",
        event_type="image.task.terminal",
        body=body,
        timestamp=1_700_000_000,
        key=key,
        hmac_secret="whsec_s",
    )
    assert set(h) == {
        "Content-Type",
        "User-Agent",
        "X-Service-Webhook-Id",
        "X-Service-Webhook-Event",
        "X-Service-Webhook-Timestamp",
        "X-Service-Webhook-Signature",
        "X-Service-Webhook-Signature-Ed25519",
        "X-Service-Webhook-Key-Id",
    }
    assert h["X-Service-Webhook-Timestamp"] == "1700000000"
    assert h["X-Service-Webhook-Key-Id"] == "key_abc"
    verify = VerifyKey(b64url_decode(public_x(key.private_key)))
    verify.verify(b"1700000000." + body, b64url_decode(h["X-Service-Webhook-Signature-Ed25519"]))
    if mode == "migration":
        expected = hmac.new(b"whsec_s", body, hashlib.sha256).hexdigest()
        assert h["X-Service-Webhook-Signature"] == expected
    else:
        assert h["X-Service-Webhook-Signature"] == h["X-Service-Webhook-Signature-Ed25519"]


@dataclass(frozen=True)
class _Delivery:
    task_id: str
    event_type: str
    body: bytes
    secret: str | None
    standard: bool | None = None

    @property
    def id(self) -> str:
        return "whd_" + self.task_id


@pytest.mark.parametrize("threaded", [False, True])
async def test_batch_signing_matches_single_signing(threaded: bool) -> None:
    """A batch (signed in a thread or inline) gets, delivery by delivery, the headers a
    single signing gives, each verifiable over its own body."""
    key = _key()
    signer = HeaderSigner("Service", "migration")
    batch = [
        _Delivery(f"t{i}", "image.task.terminal", b'{"n":%d,"e":"\xc3\xa9"}' % i, f"whsec_{i}")
        for i in range(6)
    ]
    with ThreadPoolExecutor(max_workers=1) as pool:
        signed = await signer.sign_many(key, 1_700_000_000, batch, pool if threaded else None)
    verify = VerifyKey(b64url_decode(public_x(key.private_key)))
    for delivery, headers in zip(batch, signed, strict=True):
        single = signer.headers(
            session_id=delivery.task_id,
            event_type=delivery.event_type,
            body=delivery.body,
            timestamp=1_700_000_000,
            key=key,
            hmac_secret=delivery.secret,
        )
        assert headers == single
        verify.verify(
            b"1700000000." + delivery.body,
            b64url_decode(headers["X-Service-Webhook-Signature-Ed25519"]),
        )


def test_private_key_encryption_is_bound_to_key_and_kid() -> None:
    private = Ed25519PrivateKey.generate()
    secret = bytes(range(32))
    blob = encrypt_private_key(private, "key_1", secret)
    assert public_x(decrypt_private_key(blob, "key_1", secret)) == public_x(private)
    with pytest.raises(SigningKeyError):
        decrypt_private_key(blob, "key_2", secret)
    with pytest.raises(SigningKeyError):
        decrypt_private_key(blob, "key_1", bytes(32))
