"""The verifier against the Ed25519 and HMAC schemes, with deliveries signed independently here."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from genhook.receiver import (
    VerificationFailure,
    WebhookVerificationError,
    WebhookVerifier,
)
from tests.support.jwk import b64url, jwk

SECRET = "whsec_test_secret"
NOW = 1_760_000_000


def body_for(session_id: str = "task_123", **over: Any) -> bytes:
    data: dict[str, Any] = {
        "session_id": session_id,
        "event_type": "image.task.terminal",
        "status": "OK",
        "created_at": 1_759_999_990_000,
        "payload": {
            "id": session_id,
            "model": "genhook/image-edit",
            "status": "completed",
            "outputs": ["https://example.test/o/1.jpeg"],
            "has_nsfw_contents": [False],
        },
    }
    data.update(over)
    # Non-canonical spacing and key order on purpose: only the raw bytes are signed.
    return json.dumps(data, indent=1).encode()


def headers_for(
    body: bytes,
    *,
    key: Ed25519PrivateKey | None,
    kid: str = "k1",
    timestamp: int = NOW,
    mode: str = "migration",
    brand: str = "Service",
    session_id: str = "task_123",
    event: str = "image.task.terminal",
) -> dict[str, str]:
    p = f"X-{brand}-Webhook-"
    h = {
        p + "Id": session_id,
        p + "Event": event,
        p + "Timestamp": str(timestamp),
        "Content-Type": "application/json",
        "User-Agent": f"{brand}-Webhook/1.0",
    }
    mac = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    if mode in ("migration", "hmac"):
        h[p + "Signature"] = mac
    if key is not None and mode in ("migration", "ed25519"):
        sig = b64url(key.sign(str(timestamp).encode() + b"." + body))
        h[p + "Key-Id"] = kid
        h[p + ("Signature-Ed25519" if mode == "migration" else "Signature")] = sig
    return h


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def verifier(key: Ed25519PrivateKey | None, **kw: Any) -> WebhookVerifier:
    kw.setdefault("clock", lambda: float(NOW))
    if key is not None:
        kw.setdefault("jwks", {"keys": [jwk(key, "k1")]})
    return WebhookVerifier(**kw)


def reason(exc: pytest.ExceptionInfo[WebhookVerificationError]) -> VerificationFailure:
    return exc.value.reason


def test_migration_delivery_verifies_with_ed25519_and_types_the_event(key):
    body = body_for()
    event = verifier(key, hmac_secret=SECRET).verify(headers_for(body, key=key), body)
    assert event.scheme == "ed25519" and event.key_id == "k1"
    assert event.session_id == "task_123" == event.task_id
    assert event.event_type == "image.task.terminal"
    assert event.ok and event.status == "OK" and event.error is None
    assert event.payload.status == "completed"
    assert event.payload.outputs == ["https://example.test/o/1.jpeg"]
    assert event.created_at == 1_759_999_990_000 and event.timestamp == NOW


def test_pure_ed25519_mode_reads_the_signature_header(key):
    body = body_for()
    headers = headers_for(body, key=key, mode="ed25519")
    assert "X-Service-Webhook-Signature-Ed25519" not in headers
    assert verifier(key).verify(headers, body).scheme == "ed25519"


def test_hmac_only_delivery_verifies_with_the_secret():
    body = body_for()
    event = verifier(None, hmac_secret=SECRET).verify(
        headers_for(body, key=None, mode="hmac"), body
    )
    assert event.scheme == "hmac" and event.key_id is None


def test_hmac_only_verifier_checks_hmac_of_a_migration_delivery(key):
    body = body_for()
    v = verifier(None, hmac_secret=SECRET)
    assert v.verify(headers_for(body, key=key), body).scheme == "hmac"


def test_error_event_exposes_error_and_code(key):
    body = body_for(
        status="ERROR",
        error="the prompt names no operation",
        payload={"model": "genhook/image-edit", "status": "failed", "error_code": 3001},
    )
    event = verifier(key).verify(headers_for(body, key=key), body)
    assert not event.ok and event.error == "the prompt names no operation"
    assert event.payload.error_code == 3001 and event.payload.status == "failed"
    assert event.payload.id == "task_123"  # filled from session_id when the payload has none


def test_header_names_are_case_insensitive_and_brand_configurable(key):
    body = body_for()
    headers = {k.lower(): v for k, v in headers_for(body, key=key, brand="Acme").items()}
    assert verifier(key, brand="Acme").verify(headers, body).scheme == "ed25519"
    with pytest.raises(WebhookVerificationError) as exc:
        verifier(key).verify(headers, body)
    assert reason(exc) is VerificationFailure.MISSING_HEADER


def test_tampered_body_fails_both_schemes(key):
    body = body_for()
    tampered = body.replace(b"o/1.jpeg", b"o/2.jpeg")
    with pytest.raises(WebhookVerificationError) as exc:
        verifier(key).verify(headers_for(body, key=key), tampered)
    assert reason(exc) is VerificationFailure.BAD_SIGNATURE
    with pytest.raises(WebhookVerificationError) as exc:
        verifier(None, hmac_secret=SECRET).verify(
            headers_for(body, key=None, mode="hmac"), tampered
        )
    assert reason(exc) is VerificationFailure.BAD_SIGNATURE


def test_reserialized_body_fails(key):
    body = body_for()
    reserialized = json.dumps(json.loads(body)).encode()
    with pytest.raises(WebhookVerificationError) as exc:
        verifier(key).verify(headers_for(body, key=key), reserialized)
    assert reason(exc) is VerificationFailure.BAD_SIGNATURE


def test_tampered_timestamp_fails_ed25519(key):
    body = body_for()
    headers = headers_for(body, key=key)
    headers["X-Service-Webhook-Timestamp"] = str(NOW + 1)
    with pytest.raises(WebhookVerificationError) as exc:
        verifier(key).verify(headers, body)
    assert reason(exc) is VerificationFailure.BAD_SIGNATURE


@pytest.mark.parametrize("offset", [-301, 301, -10_000])
def test_stale_or_future_timestamp_is_refused(key, offset):
    body = body_for()
    headers = headers_for(body, key=key, timestamp=NOW + offset)
    with pytest.raises(WebhookVerificationError) as exc:
        verifier(key).verify(headers, body)
    assert reason(exc) is VerificationFailure.TIMESTAMP_OUT_OF_TOLERANCE
    # The same delivery inside a wider window verifies: the refusal was the window alone.
    assert verifier(key, tolerance=20_000).verify(headers, body).session_id == "task_123"


def test_timestamp_at_the_edge_of_the_window_is_accepted(key):
    body = body_for()
    assert verifier(key).verify(headers_for(body, key=key, timestamp=NOW - 300), body)


def test_hmac_delivery_is_also_held_to_the_window():
    body = body_for()
    headers = headers_for(body, key=None, mode="hmac", timestamp=NOW - 3600)
    with pytest.raises(WebhookVerificationError) as exc:
        verifier(None, hmac_secret=SECRET).verify(headers, body)
    assert reason(exc) is VerificationFailure.TIMESTAMP_OUT_OF_TOLERANCE


@pytest.mark.parametrize("value", ["", "12.5", "-5", "abc", "１２３"])
def test_malformed_timestamp(key, value):
    body = body_for()
    headers = headers_for(body, key=key)
    headers["X-Service-Webhook-Timestamp"] = value
    with pytest.raises(WebhookVerificationError) as exc:
        verifier(key).verify(headers, body)
    expected = (
        VerificationFailure.MISSING_HEADER if value == "" else VerificationFailure.INVALID_TIMESTAMP
    )
    assert reason(exc) is expected


@pytest.mark.parametrize(
    "drop",
    [
        ["X-Service-Webhook-Id"],
        ["X-Service-Webhook-Timestamp"],
        ["X-Service-Webhook-Key-Id"],
        ["X-Service-Webhook-Signature", "X-Service-Webhook-Signature-Ed25519"],
    ],
)
def test_missing_headers(key, drop):
    body = body_for()
    headers = headers_for(body, key=key)
    for name in drop:
        del headers[name]
    with pytest.raises(WebhookVerificationError) as exc:
        verifier(key, hmac_secret=SECRET).verify(headers, body)
    assert reason(exc) is VerificationFailure.MISSING_HEADER
    assert drop[-1] in exc.value.message


def test_hmac_only_delivery_without_a_secret_is_not_verifiable(key):
    body = body_for()
    with pytest.raises(WebhookVerificationError) as exc:
        verifier(key).verify(headers_for(body, key=None, mode="hmac"), body)
    assert reason(exc) is VerificationFailure.NO_USABLE_SIGNATURE


def test_ed25519_only_delivery_with_only_a_secret_is_not_verifiable(key):
    body = body_for()
    with pytest.raises(WebhookVerificationError) as exc:
        verifier(None, hmac_secret=SECRET).verify(headers_for(body, key=key, mode="ed25519"), body)
    assert reason(exc) is VerificationFailure.NO_USABLE_SIGNATURE


def test_wrong_secret_and_wrong_key(key):
    body = body_for()
    with pytest.raises(WebhookVerificationError) as exc:
        verifier(None, hmac_secret="other").verify(headers_for(body, key=None, mode="hmac"), body)
    assert reason(exc) is VerificationFailure.BAD_SIGNATURE
    other = Ed25519PrivateKey.generate()
    with pytest.raises(WebhookVerificationError) as exc:
        verifier(key).verify(headers_for(body, key=other), body)
    assert reason(exc) is VerificationFailure.BAD_SIGNATURE


def test_unknown_kid_in_a_static_key_set(key):
    body = body_for()
    with pytest.raises(WebhookVerificationError) as exc:
        verifier(key).verify(headers_for(body, key=key, kid="k2"), body)
    assert reason(exc) is VerificationFailure.UNKNOWN_KEY


def test_ed25519_preferred_over_hmac_when_both_present(key):
    body = body_for()
    headers = headers_for(body, key=key)
    headers["X-Service-Webhook-Signature"] = "0" * 64  # a wrong HMAC is not consulted
    assert verifier(key, hmac_secret=SECRET).verify(headers, body).scheme == "ed25519"
    headers["X-Service-Webhook-Signature-Ed25519"] = b64url(b"\x00" * 64)
    with pytest.raises(WebhookVerificationError) as exc:
        verifier(key, hmac_secret=SECRET).verify(headers, body)
    assert reason(exc) is VerificationFailure.BAD_SIGNATURE


@pytest.mark.parametrize("sig", ["short", "!" * 86, b64url(b"\x00" * 63)])
def test_malformed_ed25519_signature(key, sig):
    body = body_for()
    headers = headers_for(body, key=key)
    headers["X-Service-Webhook-Signature-Ed25519"] = sig
    with pytest.raises(WebhookVerificationError) as exc:
        verifier(key).verify(headers, body)
    assert reason(exc) is VerificationFailure.MALFORMED_SIGNATURE


def test_padded_base64url_signature_is_accepted(key):
    body = body_for()
    headers = headers_for(body, key=key)
    headers["X-Service-Webhook-Signature-Ed25519"] += "=="
    assert verifier(key).verify(headers, body).scheme == "ed25519"


def test_header_id_must_equal_body_session_id(key):
    body = body_for(session_id="task_other")
    headers = headers_for(body, key=key, session_id="task_123")
    with pytest.raises(WebhookVerificationError) as exc:
        verifier(key).verify(headers, body)
    assert reason(exc) is VerificationFailure.ID_MISMATCH


def test_header_event_must_equal_body_event_type(key):
    body = body_for()
    headers = headers_for(body, key=key, event="video.task.terminal")
    with pytest.raises(WebhookVerificationError) as exc:
        verifier(key).verify(headers, body)
    assert reason(exc) is VerificationFailure.EVENT_MISMATCH


def test_signed_body_that_is_not_a_json_object(key):
    body = b"[1, 2, 3]"
    with pytest.raises(WebhookVerificationError) as exc:
        verifier(key).verify(headers_for(body, key=key), body)
    assert reason(exc) is VerificationFailure.INVALID_BODY


def test_default_clock_is_wall_time(key):
    body = body_for()
    now = int(time.time())
    headers = headers_for(body, key=key, timestamp=now)
    assert WebhookVerifier(jwks={"keys": [jwk(key, "k1")]}).verify(headers, body)


def test_constructor_rejects_unusable_configurations(key):
    with pytest.raises(ValueError):
        WebhookVerifier()
    with pytest.raises(ValueError):
        WebhookVerifier(jwks_url="http://127.0.0.1:1/jwks.json", jwks={"keys": []})


def test_error_carries_reason_in_its_text(key):
    body = body_for()
    with pytest.raises(WebhookVerificationError, match=r"^bad_signature: "):
        verifier(key).verify(headers_for(body, key=key), body + b" ")
