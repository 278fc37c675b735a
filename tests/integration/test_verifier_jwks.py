"""Key-set caching against a real JWKS server on 127.0.0.1: rotation, rate limit, outages."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from genhook.receiver import VerificationFailure, WebhookVerificationError, WebhookVerifier
from tests.support.jwk import b64url, jwk


class JwksServer:
    """Serves ``self.document`` (or ``self.status`` when not 200) and counts requests."""

    def __init__(self) -> None:
        self.document: dict[str, Any] = {"keys": []}
        self.status = 200
        self.hits = 0
        self.cache_control: str | None = None
        self.gate: threading.Event | None = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.hits += 1
                if outer.gate is not None:
                    outer.gate.wait(10)
                payload = json.dumps(outer.document).encode()
                self.send_response(outer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                if outer.cache_control is not None:
                    self.send_header("Cache-Control", outer.cache_control)
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/v1/webhooks/jwks.json"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Clock:
    def __init__(self) -> None:
        self.now = 1_760_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def jwks_server() -> Iterator[JwksServer]:
    server = JwksServer()
    yield server
    server.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def delivery(
    key: Ed25519PrivateKey, kid: str, ts: int, sid: str = "t1"
) -> tuple[dict[str, str], bytes]:
    body = json.dumps(
        {
            "session_id": sid,
            "event_type": "image.task.terminal",
            "status": "OK",
            "created_at": 1,
            "payload": {"model": "m", "status": "completed", "outputs": []},
        }
    ).encode()
    sig = b64url(key.sign(str(ts).encode() + b"." + body))
    return (
        {
            "X-Service-Webhook-Id": sid,
            "X-Service-Webhook-Timestamp": str(ts),
            "X-Service-Webhook-Key-Id": kid,
            "X-Service-Webhook-Signature-Ed25519": sig,
        },
        body,
    )


def make(server: JwksServer, clock: Clock, **kw: Any) -> WebhookVerifier:
    return WebhookVerifier(jwks_url=server.url, clock=clock, **kw)


def test_key_set_is_fetched_once_and_cached(jwks_server, clock):
    k1 = Ed25519PrivateKey.generate()
    jwks_server.document = {"keys": [jwk(k1, "k1")]}
    v = make(jwks_server, clock)
    for i in range(20):
        assert v.verify(*delivery(k1, "k1", int(clock.now), sid=f"t{i}")).key_id == "k1"
    assert jwks_server.hits == 1


def test_rotation_unknown_kid_refetches_once_then_succeeds(jwks_server, clock):
    k1, k2 = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    jwks_server.document = {"keys": [jwk(k1, "k1")]}
    v = make(jwks_server, clock, min_refetch_interval=30)
    v.verify(*delivery(k1, "k1", int(clock.now)))
    clock.now += 60
    jwks_server.document = {"keys": [jwk(k2, "k2"), jwk(k1, "k1")]}
    assert v.verify(*delivery(k2, "k2", int(clock.now))).key_id == "k2"
    assert jwks_server.hits == 2
    # Both keys now come from the cache.
    v.verify(*delivery(k1, "k1", int(clock.now)))
    v.verify(*delivery(k2, "k2", int(clock.now)))
    assert jwks_server.hits == 2


def test_unknown_kid_flood_is_rate_limited(jwks_server, clock):
    k1 = Ed25519PrivateKey.generate()
    jwks_server.document = {"keys": [jwk(k1, "k1")]}
    v = make(jwks_server, clock, min_refetch_interval=30)
    v.verify(*delivery(k1, "k1", int(clock.now)))
    clock.now += 31
    for i in range(50):
        with pytest.raises(WebhookVerificationError) as exc:
            v.verify(*delivery(k1, f"forged-{i}", int(clock.now)))
        assert exc.value.reason is VerificationFailure.UNKNOWN_KEY
    assert jwks_server.hits == 2  # the first load, then one refetch for the whole flood
    # Known keys keep verifying during the flood.
    assert v.verify(*delivery(k1, "k1", int(clock.now))).key_id == "k1"
    clock.now += 31
    with pytest.raises(WebhookVerificationError):
        v.verify(*delivery(k1, "forged-late", int(clock.now)))
    assert jwks_server.hits == 3  # one more refetch once the interval passed


def test_rotation_inside_the_rate_limit_window_waits_for_it(jwks_server, clock):
    k1, k2 = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    jwks_server.document = {"keys": [jwk(k1, "k1")]}
    v = make(jwks_server, clock, min_refetch_interval=30)
    v.verify(*delivery(k1, "k1", int(clock.now)))
    jwks_server.document = {"keys": [jwk(k2, "k2")]}
    with pytest.raises(WebhookVerificationError) as exc:
        v.verify(*delivery(k2, "k2", int(clock.now)))
    assert exc.value.reason is VerificationFailure.UNKNOWN_KEY and jwks_server.hits == 1
    clock.now += 30
    assert v.verify(*delivery(k2, "k2", int(clock.now))).key_id == "k2"
    assert jwks_server.hits == 2


def test_retired_key_stops_verifying_after_refresh(jwks_server, clock):
    k1, k2 = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    jwks_server.document = {"keys": [jwk(k1, "k1")]}
    v = make(jwks_server, clock, max_key_age=600)
    v.verify(*delivery(k1, "k1", int(clock.now)))
    jwks_server.document = {"keys": [jwk(k2, "k2")]}
    clock.now += 601  # cache expired: the next lookup refreshes
    with pytest.raises(WebhookVerificationError) as exc:
        v.verify(*delivery(k1, "k1", int(clock.now)))
    assert exc.value.reason is VerificationFailure.UNKNOWN_KEY
    assert jwks_server.hits == 2


def test_outage_keeps_serving_cached_keys(jwks_server, clock):
    k1 = Ed25519PrivateKey.generate()
    jwks_server.document = {"keys": [jwk(k1, "k1")]}
    v = make(jwks_server, clock, max_key_age=600)
    v.verify(*delivery(k1, "k1", int(clock.now)))
    jwks_server.status = 503
    clock.now += 601
    assert v.verify(*delivery(k1, "k1", int(clock.now))).key_id == "k1"
    assert jwks_server.hits == 2


def test_unreachable_key_set_is_reported_and_not_hammered(jwks_server, clock):
    jwks_server.status = 500
    k1 = Ed25519PrivateKey.generate()
    v = make(jwks_server, clock)
    for _ in range(5):
        with pytest.raises(WebhookVerificationError) as exc:
            v.verify(*delivery(k1, "k1", int(clock.now)))
        assert exc.value.reason is VerificationFailure.KEYS_UNAVAILABLE
    assert jwks_server.hits == 1


def test_malformed_key_entries_are_skipped(jwks_server, clock):
    k1 = Ed25519PrivateKey.generate()
    jwks_server.document = {
        "keys": [
            {"kty": "RSA", "kid": "rsa", "n": "AQAB", "e": "AQAB"},
            {"kty": "OKP", "crv": "Ed25519", "kid": "short", "x": b64url(b"\x01" * 31)},
            {"kty": "OKP", "crv": "Ed25519", "kid": "enc", "use": "enc", "x": b64url(b"\x01" * 32)},
            "not-an-object",
            jwk(k1, "k1"),
        ]
    }
    v = make(jwks_server, clock)
    assert v.verify(*delivery(k1, "k1", int(clock.now))).key_id == "k1"
    with pytest.raises(WebhookVerificationError) as exc:
        v.verify(*delivery(k1, "short", int(clock.now)))
    assert exc.value.reason is VerificationFailure.UNKNOWN_KEY


def test_concurrent_threads_share_one_fetch(jwks_server, clock):
    k1 = Ed25519PrivateKey.generate()
    jwks_server.document = {"keys": [jwk(k1, "k1")]}
    jwks_server.gate = threading.Event()
    v = make(jwks_server, clock)
    with ThreadPoolExecutor(8) as pool:
        futures = [
            pool.submit(v.verify, *delivery(k1, "k1", int(clock.now), f"t{i}")) for i in range(8)
        ]
        jwks_server.gate.set()
        assert {f.result().key_id for f in futures} == {"k1"}
    assert jwks_server.hits == 1


async def test_async_verify_flood_shares_one_fetch(jwks_server, clock):
    k1 = Ed25519PrivateKey.generate()
    jwks_server.document = {"keys": [jwk(k1, "k1")]}
    v = make(jwks_server, clock, min_refetch_interval=30)
    events = await asyncio.gather(
        *(v.averify(*delivery(k1, "k1", int(clock.now), f"t{i}")) for i in range(10))
    )
    assert {e.key_id for e in events} == {"k1"} and jwks_server.hits == 1
    clock.now += 31
    results = await asyncio.gather(
        *(v.averify(*delivery(k1, f"forged-{i}", int(clock.now))) for i in range(20)),
        return_exceptions=True,
    )
    assert all(
        isinstance(r, WebhookVerificationError) and r.reason is VerificationFailure.UNKNOWN_KEY
        for r in results
    )
    assert jwks_server.hits == 2


def test_one_verifier_serves_several_event_loops(jwks_server, clock):
    k1 = Ed25519PrivateKey.generate()
    jwks_server.document = {"keys": [jwk(k1, "k1")]}
    v = make(jwks_server, clock, min_refetch_interval=0)

    async def burst(tag: str) -> list[Any]:
        return await asyncio.gather(
            *(v.averify(*delivery(k1, f"{tag}-{i}", int(clock.now))) for i in range(5)),
            return_exceptions=True,
        )

    for tag in ("first", "second"):  # each asyncio.run is a new loop
        results = asyncio.run(burst(tag))
        assert all(
            isinstance(r, WebhookVerificationError) and r.reason is VerificationFailure.UNKNOWN_KEY
            for r in results
        )
    assert asyncio.run(v.averify(*delivery(k1, "k1", int(clock.now)))).key_id == "k1"


def test_the_key_set_is_kept_only_as_long_as_its_cache_control_says(jwks_server, clock):
    k1, k2 = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    jwks_server.document = {"keys": [jwk(k1, "k1")]}
    jwks_server.cache_control = "public, max-age=120"
    v = make(jwks_server, clock)  # its own ceiling: an hour
    v.verify(*delivery(k1, "k1", int(clock.now)))
    jwks_server.document = {"keys": [jwk(k2, "k2")]}  # k1 retired
    clock.now += 119
    assert v.verify(*delivery(k1, "k1", int(clock.now))).key_id == "k1"
    assert jwks_server.hits == 1
    clock.now += 1
    with pytest.raises(WebhookVerificationError) as exc:
        v.verify(*delivery(k1, "k1", int(clock.now)))
    assert exc.value.reason is VerificationFailure.UNKNOWN_KEY
    assert jwks_server.hits == 2
    # no-store: not kept; the next lookup past the refetch interval fetches again.
    jwks_server.cache_control = "no-store"
    clock.now += 120
    v.verify(*delivery(k2, "k2", int(clock.now)))
    clock.now += 30
    v.verify(*delivery(k2, "k2", int(clock.now)))
    assert jwks_server.hits == 4
    # A max-age longer than the verifier's own ceiling is held to the ceiling.
    jwks_server.cache_control = "max-age=99999"
    short = make(jwks_server, clock, max_key_age=60)
    short.verify(*delivery(k2, "k2", int(clock.now)))
    clock.now += 60
    short.verify(*delivery(k2, "k2", int(clock.now)))
    assert jwks_server.hits == 6


def test_a_day_long_max_age_is_held_to_the_default_hour(jwks_server, clock):
    """The rule the TypeScript SDK shares: max-age, at most max_key_age (an hour)."""
    k1 = Ed25519PrivateKey.generate()
    jwks_server.document = {"keys": [jwk(k1, "k1")]}
    jwks_server.cache_control = "public, max-age=86400"
    v = make(jwks_server, clock)
    v.verify(*delivery(k1, "k1", int(clock.now)))
    clock.now += 3599
    v.verify(*delivery(k1, "k1", int(clock.now)))
    assert jwks_server.hits == 1
    clock.now += 1
    v.verify(*delivery(k1, "k1", int(clock.now)))
    assert jwks_server.hits == 2
