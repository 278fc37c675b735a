"""The SDK, the verifier and ``listen`` against the whole service running as a subprocess.

Deliveries go to a ``genhook.client`` Listener on 127.0.0.1 that records every request; the
tests then verify those real deliveries with the SDK in both signing modes.
"""

from __future__ import annotations

import base64
import io
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from genhook.client import (
    Client,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    Unauthorized,
)
from genhook.client._listen import Delivery, Listener
from genhook.receiver import VerificationFailure, WebhookVerificationError, WebhookVerifier
from tests.conftest import LiveService, start_service, stop_service
from tests.support.http import HTTP

MODEL = "test/fake-edit"


def red_png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(buffer, "PNG")
    return buffer.getvalue()


class Inbox:
    """A Listener without verification that keeps every delivery, for later checks."""

    def __init__(self, forward_to: str | None = None) -> None:
        self.deliveries: list[Delivery] = []
        self._cond = threading.Condition()
        self.listener = Listener(
            verifier=None, on_delivery=self._keep, forward_to=forward_to, port=0
        ).start()
        self.url = self.listener.url + "/hooks/genhook"

    def _keep(self, delivery: Delivery) -> None:
        with self._cond:
            self.deliveries.append(delivery)
            self._cond.notify_all()

    def wait_for(self, session_id: str, timeout: float = 60) -> Delivery:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for d in self.deliveries:
                    if f'"session_id":"{session_id}"'.encode() in d.body.replace(b" ", b""):
                        return d
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no delivery for {session_id}")
                self._cond.wait(left)

    def close(self) -> None:
        self.listener.close()


def headers_of(delivery: Delivery) -> dict[str, str]:
    return dict(delivery.headers)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveService]:
    svc = start_service(tmp_path_factory.mktemp("migration"))
    yield svc
    stop_service(svc)


@pytest.fixture(scope="module")
def ed25519_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveService]:
    svc = start_service(
        tmp_path_factory.mktemp("ed25519"),
        GENHOOK_WEBHOOK_SIGNING="ed25519",
        GENHOOK_WEBHOOK_HEADER_BRAND="Acme",
        GENHOOK_MAX_BODY_BYTES="200000",
    )
    yield svc
    stop_service(svc)


@pytest.fixture
def inbox() -> Iterator[Inbox]:
    box = Inbox()
    yield box
    box.close()


def jwks_url(svc: LiveService) -> str:
    return svc.base_url + "/api/v1/webhooks/jwks.json"


def test_submit_wait_and_verify_a_migration_delivery(service, inbox, tmp_path: Path):
    path = tmp_path / "in.png"
    path.write_bytes(red_png())
    with Client(service.api_key, base_url=service.base_url) as client:
        created = client.edit(
            "make it pop",
            [path, Image.new("RGB", (8, 8), (10, 10, 200))],
            model=MODEL,
            size="1024*1024",
            output_format="png",
            webhook_url=inbox.url,
        )
        assert created.id and created.status in ("created", "processing")
        assert created.urls["get"].endswith(created.id)
        done = client.wait(created.id, timeout=60, poll_interval=0.05)
        assert done.succeeded and len(done.outputs) == 1 and done.has_nsfw_contents == [False]
        assert client.result(created.id).outputs == done.outputs
        output = HTTP.get(done.outputs[0], headers={"Authorization": f"Bearer {service.api_key}"})
        assert output.status_code == 200
        assert Image.open(io.BytesIO(output.content)).size == (1024, 1024)

    delivery = inbox.wait_for(created.id)
    headers, body = headers_of(delivery), delivery.body
    assert "X-Service-Webhook-Signature-Ed25519" in headers
    event = WebhookVerifier(jwks_url=jwks_url(service)).verify(headers, body)
    assert event.scheme == "ed25519" and event.session_id == created.id
    assert event.event_type == "image.task.terminal" and event.ok
    assert event.payload.status == "completed" and event.payload.outputs == done.outputs
    hmac_event = WebhookVerifier(hmac_secret=service.signing_secret).verify(headers, body)
    assert hmac_event.scheme == "hmac" and hmac_event.session_id == created.id

    # Tampering with the real delivery: body, timestamp, and an old timestamp.
    verifier = WebhookVerifier(jwks_url=jwks_url(service), hmac_secret=service.signing_secret)
    with pytest.raises(WebhookVerificationError) as exc:
        verifier.verify(headers, body.replace(b"completed", b"completes"))
    assert exc.value.reason is VerificationFailure.BAD_SIGNATURE
    moved = {
        **headers,
        "X-Service-Webhook-Timestamp": str(int(headers["X-Service-Webhook-Timestamp"]) + 1),
    }
    with pytest.raises(WebhookVerificationError) as exc:
        verifier.verify(moved, body)
    assert exc.value.reason is VerificationFailure.BAD_SIGNATURE
    later = WebhookVerifier(jwks_url=jwks_url(service), clock=lambda: time.time() + 3600)
    with pytest.raises(WebhookVerificationError) as exc:
        later.verify(headers, body)
    assert exc.value.reason is VerificationFailure.TIMESTAMP_OUT_OF_TOLERANCE
    # An Ed25519-only header set verifies. An HMAC-only one verifies only for a receiver that
    # configured HMAC alone: a verifier that knows Ed25519 keys never falls back to HMAC.
    ed_only = {k: v for k, v in headers.items() if k != "X-Service-Webhook-Signature"}
    assert verifier.verify(ed_only, body).scheme == "ed25519"
    hmac_only = {k: v for k, v in headers.items() if k != "X-Service-Webhook-Signature-Ed25519"}
    hmac_verifier = WebhookVerifier(hmac_secret=service.signing_secret)
    assert hmac_verifier.verify(hmac_only, body).scheme == "hmac"
    with pytest.raises(WebhookVerificationError) as exc:
        verifier.verify(hmac_only, body)
    assert exc.value.reason is VerificationFailure.NO_USABLE_SIGNATURE
    with pytest.raises(WebhookVerificationError) as exc:
        verifier.verify({k: v for k, v in headers.items() if "Signature" not in k}, body)
    assert exc.value.reason is VerificationFailure.MISSING_HEADER


def test_failed_task_delivery_carries_error_and_code(service, inbox):
    with Client(service.api_key, base_url=service.base_url) as client:
        created = client.edit(
            "please fail", red_png(), model=MODEL, size="1024*1024", webhook_url=inbox.url
        )
        done = client.wait(created.id, timeout=60, poll_interval=0.05)
    assert done.status == "failed" and done.error_code is not None
    event = WebhookVerifier(jwks_url=jwks_url(service)).verify(*_hb(inbox.wait_for(created.id)))
    assert not event.ok and event.status == "ERROR" and event.error
    assert event.payload.status == "failed" and event.payload.error_code == done.error_code


def _hb(delivery: Delivery) -> tuple[dict[str, str], bytes]:
    return headers_of(delivery), delivery.body


def test_rotation_unknown_kid_refetches_once(service, inbox):
    verifier = WebhookVerifier(jwks_url=jwks_url(service), min_refetch_interval=0)
    with Client(service.api_key, base_url=service.base_url) as client:
        first = client.edit("x", red_png(), model=MODEL, size="1024*1024", webhook_url=inbox.url)
        event = verifier.verify(*_hb(inbox.wait_for(first.id)))
        old_kid = event.key_id
        assert verifier.keys is not None and verifier.keys.fetches == 1  # type: ignore[union-attr]
        rotated = service.cli("signing-keys", "rotate")
        assert rotated.returncode == 0, rotated.stdout + rotated.stderr
        # The service picks up the new key within a couple of seconds; until then deliveries
        # still carry the old kid and verify from the cache without any fetch.
        for _ in range(40):
            second = client.edit(
                "x", red_png(), model=MODEL, size="1024*1024", webhook_url=inbox.url
            )
            event = verifier.verify(*_hb(inbox.wait_for(second.id)))
            if event.key_id != old_kid:
                break
            assert verifier.keys.fetches == 1  # type: ignore[union-attr]
            time.sleep(0.2)
    assert event.key_id != old_kid
    assert verifier.keys.fetches == 2  # type: ignore[union-attr]


def test_unknown_kid_that_stays_unknown_is_rate_limited(service, inbox):
    verifier = WebhookVerifier(jwks_url=jwks_url(service), min_refetch_interval=3600)
    with Client(service.api_key, base_url=service.base_url) as client:
        created = client.edit("x", red_png(), model=MODEL, size="1024*1024", webhook_url=inbox.url)
    headers, body = _hb(inbox.wait_for(created.id))
    verifier.verify(headers, body)
    for i in range(20):
        forged = {**headers, "X-Service-Webhook-Key-Id": f"forged-{i}"}
        with pytest.raises(WebhookVerificationError) as exc:
            verifier.verify(forged, body)
        assert exc.value.reason is VerificationFailure.UNKNOWN_KEY
    assert verifier.keys.fetches == 1  # type: ignore[union-attr]


def test_client_error_mapping_live(service):
    with Client("ghk_wrong", base_url=service.base_url) as bad, pytest.raises(Unauthorized) as exc:
        bad.result("anything")
    assert exc.value.status_code == 401 and exc.value.message
    with Client(service.api_key, base_url=service.base_url) as client:
        with pytest.raises(NotFound):
            client.result("no-such-task")
        with pytest.raises(InvalidRequest) as exc:
            client.edit("x", [red_png(), "ftp://example.test/a.png"], model=MODEL, size="7*7")
        fields = {e.field for e in exc.value.errors}
        assert "images[1]" in fields and "size" in fields
        with pytest.raises(InvalidRequest) as exc:
            client.edit("x", red_png(), model=MODEL, webhook_url="https://127.0.0.1/" + "a" * 1100)
        assert "1024" in exc.value.message
        assert [e.field for e in exc.value.errors] == ["webhook_url"]
        assert client.usage().currency == "USD"


def test_pure_ed25519_mode_with_a_custom_brand(ed25519_service):
    svc = ed25519_service
    box = Inbox()
    try:
        with Client(svc.api_key, base_url=svc.base_url) as client:
            created = client.edit(
                "x", red_png(), model=MODEL, size="1024*1024", webhook_url=box.url
            )
            with pytest.raises(PayloadTooLarge):
                client.edit("x", b"\x89PNG\r\n\x1a\n" + bytes(300_000), model=MODEL)
        headers, body = _hb(box.wait_for(created.id))
    finally:
        box.close()
    # HMAC retired: X-Acme-Webhook-Signature carries the Ed25519 signature (86 base64url chars).
    assert len(headers["X-Acme-Webhook-Signature"].rstrip("=")) == 86
    verifier = WebhookVerifier(jwks_url=jwks_url(svc), brand="Acme")
    event = verifier.verify(headers, body)
    assert event.scheme == "ed25519" and event.session_id == created.id
    fallback = {k: v for k, v in headers.items() if k != "X-Acme-Webhook-Signature-Ed25519"}
    assert verifier.verify(fallback, body).scheme == "ed25519"
    with pytest.raises(WebhookVerificationError) as exc:
        WebhookVerifier(hmac_secret=svc.signing_secret, brand="Acme").verify(headers, body)
    assert exc.value.reason is VerificationFailure.NO_USABLE_SIGNATURE
    with pytest.raises(WebhookVerificationError) as exc:
        WebhookVerifier(jwks_url=jwks_url(svc)).verify(headers, body)  # wrong brand
    assert exc.value.reason is VerificationFailure.MISSING_HEADER


class _Sink:
    def __init__(self) -> None:
        self.received: list[tuple[bytes, list[tuple[str, str]]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                outer.received.append(
                    (
                        self.rfile.read(int(self.headers["Content-Length"])),
                        list(self.headers.items()),
                    )
                )
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/app/hook"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_listen_forwards_real_deliveries_byte_identical(service):
    sink = _Sink()
    box = Inbox(forward_to=sink.url)
    try:
        with Client(service.api_key, base_url=service.base_url) as client:
            created = client.edit(
                "x", red_png(), model=MODEL, size="1024*1024", webhook_url=box.url
            )
        delivery = box.wait_for(created.id)
    finally:
        box.close()
        sink.close()
    assert delivery.forwarded_status == 204 and delivery.answered == 204
    [(body, headers)] = sink.received
    assert body == delivery.body
    received = {
        k: v
        for k, v in delivery.headers
        if k.lower() not in ("host", "content-length", "connection")
    }
    assert {k: v for k, v in headers if k in received} == received
    # The app behind ``listen`` verifies the forwarded copy as if it came straight from the service.
    event = WebhookVerifier(jwks_url=jwks_url(service)).verify(dict(headers), body)
    assert event.session_id == created.id
    assert base64.urlsafe_b64decode(dict(headers)["X-Service-Webhook-Signature-Ed25519"] + "==")


def test_listen_command_with_the_live_service(service):
    sink = _Sink()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "genhook.cli",
            "listen",
            "--port",
            "0",
            "--base-url",
            service.base_url,
            "--hmac-secret",
            service.signing_secret,
            "--forward-to",
            sink.url,
            "--max-deliveries",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**service.env, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"},
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        url = ""
        for line in proc.stdout:
            lines.append(line)
            if "Listening on " in line:
                url = line.split("Listening on ", 1)[1].strip()
                break
        assert url, "".join(lines)
        with Client(service.api_key, base_url=service.base_url) as client:
            created = client.edit(
                "x", red_png(), model=MODEL, size="1024*1024", webhook_url=url + "/cb"
            )
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        sink.close()
    text = "".join(lines) + out
    assert proc.returncode == 0, text
    assert "verified ed25519" in text and created.id in text and "forwarded → 204" in text
    [(body, headers)] = sink.received
    event = WebhookVerifier(jwks_url=jwks_url(service), hmac_secret=service.signing_secret).verify(
        dict(headers), body
    )
    assert event.session_id == created.id


def test_models_command_and_sdk_with_the_live_service(service):
    with Client(service.api_key, base_url=service.base_url) as client:
        ids = {model.id for model in client.models()}
        assert {"genhook/image-edit", "genhook/image-to-video", MODEL} <= ids
        assert client.model("genhook/image-to-video").kind == "video"
    env = {**service.env, "COLUMNS": "200"}
    common = ["--base-url", service.base_url, "--api-key", service.api_key]
    listed = subprocess.run(
        [sys.executable, "-m", "genhook.cli", "models", *common],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    assert "genhook/image-to-video" in listed.stdout and MODEL in listed.stdout
    one = subprocess.run(
        [sys.executable, "-m", "genhook.cli", "models", "genhook/image-to-video", *common],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert one.returncode == 0, one.stderr
    assert "duration" in one.stdout and "1080p" in one.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "genhook.cli", "models", "nobody/nothing", *common],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert missing.returncode == 3 and "404" in missing.stderr


def test_a_video_through_the_whole_service(service, inbox):
    """A real video task through ``genhook serve``'s worker processes, its signed
    ``video.task.terminal`` callback, and the MP4 fetched with Range requests."""
    import av

    from genhook.client import data_url

    with Client(service.api_key, base_url=service.base_url) as client:
        created = client.submit(
            "genhook/image-to-video",
            kind="video",
            prompt="zoom in, then fade out",
            images=[data_url(red_png())],
            duration=1,
            resolution="480p",
            fps=24,
            webhook_url=inbox.url,
        )
        done = client.wait(created.id, timeout=120, poll_interval=0.1)
    assert done.succeeded, done.raw
    url = done.outputs[0]
    assert url.endswith(".mp4")
    whole = HTTP.get(url)
    assert whole.headers["content-type"] == "video/mp4"
    head = HTTP.get(url, headers={"Range": "bytes=0-1023"})
    assert head.status_code == 206 and head.content == whole.content[:1024]
    with av.open(io.BytesIO(whole.content)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264"
        assert (stream.codec_context.width, stream.codec_context.height) == (480, 480)
        assert sum(1 for _ in container.decode(stream)) == 24
    event = WebhookVerifier(hmac_secret=service.signing_secret).verify(
        headers_of(inbox.wait_for(created.id)), inbox.wait_for(created.id).body
    )
    assert event.event_type == "video.task.terminal" and event.payload.outputs == done.outputs
