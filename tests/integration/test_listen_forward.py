"""``genhook listen``: verification, byte-identical forwarding to a local sink, the command."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from genhook.client._listen import Delivery, Listener
from genhook.receiver import VerificationFailure, WebhookVerifier
from tests.support.http import HTTP

ROOT = Path(__file__).resolve().parents[2]
KEY = Ed25519PrivateKey.generate()
SECRET = "whsec_listen"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


JWKS = {
    "keys": [
        {
            "kty": "OKP",
            "crv": "Ed25519",
            "use": "sig",
            "alg": "EdDSA",
            "kid": "k1",
            "x": b64url(KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)),
        }
    ]
}


def signed(sid: str = "task_L", status: str = "OK") -> tuple[bytes, list[tuple[str, str]]]:
    body = (
        b'{"session_id":"' + sid.encode() + b'",  "event_type":"image.task.terminal",'
        b'"status":"' + status.encode() + b'","created_at":7,'
        b'"payload":{"model":"genhook/image-edit","status":"completed",'
        b'"outputs":["http://127.0.0.1/o/1.png"]}, "note": "caf\xc3\xa9"}'
    )
    ts = str(int(time.time()))
    return body, [
        ("Content-Type", "application/json"),
        ("User-Agent", "Service-Webhook/1.0"),
        ("X-Service-Webhook-Id", sid),
        ("X-Service-Webhook-Event", "image.task.terminal"),
        ("X-Service-Webhook-Timestamp", ts),
        (
            "X-Service-Webhook-Signature",
            hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest(),
        ),
        ("X-Service-Webhook-Signature-Ed25519", b64url(KEY.sign(ts.encode() + b"." + body))),
        ("X-Service-Webhook-Key-Id", "k1"),
        ("X-Custom-Trace", "abc123"),
    ]


class Sink:
    """A local app that records exactly what it received."""

    def __init__(self, status: int = 202) -> None:
        self.received: list[tuple[bytes, list[tuple[str, str]], str]] = []
        self.status = status
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.received.append((body, list(self.headers.items()), self.path))
                answer = b'{"sink": "ok"}'
                self.send_response(outer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/genhook"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def sink() -> Iterator[Sink]:
    s = Sink()
    yield s
    s.close()


def listener(sink_url: str | None, deliveries: list[Delivery], **kw: Any) -> Listener:
    verifier = WebhookVerifier(jwks=JWKS, hmac_secret=SECRET)
    return Listener(
        verifier=verifier, on_delivery=deliveries.append, forward_to=sink_url, port=0, **kw
    )


def test_forwards_exact_bytes_and_headers_and_relays_the_answer(sink):
    deliveries: list[Delivery] = []
    body, headers = signed()
    with listener(sink.url, deliveries) as lst:
        response = HTTP.post(lst.url + "/any/path", content=body, headers=headers)
    assert response.status_code == 202 and response.json() == {"sink": "ok"}
    [(got_body, got_headers, path)] = sink.received
    assert got_body == body
    assert path == "/hooks/genhook"
    sent = [(k, v) for k, v in headers]
    forwarded = [
        (k, v)
        for k, v in got_headers
        if k.lower() not in ("host", "content-length", "accept", "accept-encoding", "connection")
    ]
    assert forwarded == sent  # same names, same case, same order, same values
    assert dict((k.lower(), v) for k, v in got_headers)["content-length"] == str(len(body))
    [d] = deliveries
    assert d.verified and d.event is not None and d.event.scheme == "ed25519"
    assert d.forwarded_status == 202 and d.answered == 202 and d.path == "/any/path"


def test_chunked_delivery_is_forwarded_byte_identical(sink):
    deliveries: list[Delivery] = []
    body, headers = signed("task_chunked")

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(body), 17):
            yield body[i : i + 17]

    with listener(sink.url, deliveries) as lst:
        response = HTTP.post(lst.url, content=chunks(), headers=headers)
    assert response.status_code == 202
    assert sink.received[0][0] == body and deliveries[0].verified


def test_unverified_delivery_is_refused_and_not_forwarded(sink):
    deliveries: list[Delivery] = []
    body, headers = signed()
    with listener(sink.url, deliveries) as lst:
        response = HTTP.post(lst.url, content=body + b" ", headers=headers)
    assert response.status_code == 400 and response.json() == {"reason": "bad_signature"}
    assert sink.received == []
    assert deliveries[0].error is not None
    assert deliveries[0].error.reason is VerificationFailure.BAD_SIGNATURE


def test_forward_unverified_on_request(sink):
    deliveries: list[Delivery] = []
    body, headers = signed()
    with listener(sink.url, deliveries, forward_unverified=True) as lst:
        response = HTTP.post(lst.url, content=body + b" ", headers=headers)
    assert response.status_code == 202 and sink.received[0][0] == body + b" "
    assert not deliveries[0].verified


def test_unreachable_app_answers_502_so_the_service_retries():
    deliveries: list[Delivery] = []
    dead = Sink()
    url = dead.url
    dead.close()
    body, headers = signed()
    with listener(url, deliveries) as lst:
        response = HTTP.post(lst.url, content=body, headers=headers)
    assert response.status_code == 502 and deliveries[0].forward_error


def test_without_forwarding_a_verified_delivery_gets_200():
    deliveries: list[Delivery] = []
    body, headers = signed()
    with listener(None, deliveries) as lst:
        assert HTTP.post(lst.url, content=body, headers=headers).status_code == 200


def test_close_waits_for_the_answer_to_a_reported_delivery():
    """``listen --max-deliveries`` closes from inside on_delivery: the answer still goes out."""
    order: list[str] = []
    closer: list[threading.Thread] = []
    body, headers = signed()

    def report(delivery: Delivery) -> None:
        def close() -> None:
            lst.close()
            order.append("closed")

        closer.append(threading.Thread(target=close))
        closer[0].start()
        time.sleep(0.3)  # the answer is not yet written while close() runs
        order.append("reported")

    lst = Listener(verifier=WebhookVerifier(jwks=JWKS), on_delivery=report, port=0).start()
    response = HTTP.post(lst.url, content=body, headers=headers)
    closer[0].join(timeout=10)
    assert response.status_code == 200 and response.json() == {"received": True}
    assert order == ["reported", "closed"]


def test_listen_command_end_to_end(sink, tmp_path):
    jwks_path = tmp_path / "jwks.json"
    jwks_path.write_text(json.dumps(JWKS))
    jwks_server = ThreadingHTTPServer(("127.0.0.1", 0), _file_handler(jwks_path))
    threading.Thread(target=jwks_server.serve_forever, args=(0.05,), daemon=True).start()
    jwks_url = f"http://127.0.0.1:{jwks_server.server_address[1]}/jwks.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "genhook.cli",
            "listen",
            "--port",
            "0",
            "--jwks-url",
            jwks_url,
            "--hmac-secret",
            SECRET,
            "--forward-to",
            sink.url,
            "--max-deliveries",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = None
        lines: list[str] = []
        for line in proc.stdout:
            lines.append(line)
            if "Listening on " in line:
                url = line.split("Listening on ", 1)[1].strip()
                break
        assert url, "".join(lines)
        body, headers = signed("task_cli")
        assert HTTP.post(url, content=body, headers=headers).status_code == 202
        bad_body, bad_headers = signed("task_bad")
        assert (
            HTTP.post(url, content=bad_body.replace(b"7", b"8"), headers=bad_headers).status_code
            == 400
        )
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        jwks_server.shutdown()
        jwks_server.server_close()
    text = "".join(lines) + out
    assert proc.returncode == 0, text
    assert "verified ed25519 kid k1" in text and "task_cli" in text
    assert "image.task.terminal" in text and "http://127.0.0.1/o/1.png" in text
    assert "forwarded → 202" in text and "bad_signature" in text
    assert [r[0] for r in sink.received] == [body]


def _file_handler(path: Path) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = path.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


def _ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback")
def test_listens_on_ipv6_loopback():
    deliveries: list[Delivery] = []
    body, headers = signed()
    verifier = WebhookVerifier(jwks=JWKS)
    with Listener(verifier=verifier, on_delivery=deliveries.append, host="::1", port=0) as lst:
        assert lst.url.startswith("http://[::1]:")
        assert HTTP.post(lst.url, content=body, headers=headers).status_code == 200
    assert deliveries[0].verified
