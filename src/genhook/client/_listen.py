"""A local webhook receiver for development, the engine behind ``genhook listen``.

Standard-library HTTP server (no web framework, so it runs on the bare SDK install): each
delivery is verified, reported to a callback, and optionally re-POSTed with the exact body
bytes and headers to a local app, whose answer is relayed back to the service so its retry
behaviour is exercised end to end.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from genhook.client._event import WebhookEvent, WebhookVerificationError
from genhook.client._verifier import WebhookVerifier

# Hop-by-hop headers belong to one connection and are never forwarded (RFC 9110 7.6.1);
# Content-Length is recomputed from the identical body, so it comes out the same.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
MAX_BODY_BYTES = 16 * 1024 * 1024


@dataclass
class Delivery:
    """One request the listener received, and what became of it."""

    received_at: float
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes
    event: WebhookEvent | None = None
    error: WebhookVerificationError | None = None
    forwarded_status: int | None = None
    forward_error: str | None = None
    forward_ms: float | None = None
    answered: int = 0

    @property
    def verified(self) -> bool:
        return self.event is not None


OnDelivery = Callable[[Delivery], None]


class Listener:
    """Receive deliveries on ``host:port`` (port 0 picks a free one).

    With a ``verifier``, a delivery that fails verification is answered 400 and not
    forwarded unless ``forward_unverified``. Without ``forward_to`` a good delivery is
    answered 200; with it, the local app's status and body are relayed (502 if unreachable).
    """

    def __init__(
        self,
        *,
        verifier: WebhookVerifier | None,
        on_delivery: OnDelivery,
        forward_to: str | None = None,
        forward_unverified: bool = False,
        forward_timeout: float = 10.0,
        host: str = "127.0.0.1",
        port: int = 4242,
    ) -> None:
        self.verifier = verifier
        self.on_delivery = on_delivery
        self.forward_to = forward_to
        self.forward_unverified = forward_unverified
        self._forward = httpx.Client(timeout=forward_timeout) if forward_to else None
        self._server = _make_server(host, port, self)
        self._thread: threading.Thread | None = None
        # Requests between reading and answering: close() waits for them, so a delivery
        # already reported to on_delivery is never left without its answer.
        self._in_flight = 0
        self._idle = threading.Condition()

    @property
    def url(self) -> str:
        address = self._server.server_address
        host, port = str(address[0]), int(address[1])
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}"

    def serve_forever(self) -> None:
        self._server.serve_forever(poll_interval=0.1)

    def start(self) -> Listener:
        """Serve in a background thread (for tests and embedding)."""
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()
        return self

    def close(self, answer_timeout: float = 10.0) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
        with self._idle:
            self._idle.wait_for(lambda: self._in_flight == 0, timeout=answer_timeout)
        self._server.server_close()
        if self._forward is not None:
            self._forward.close()

    def __enter__(self) -> Listener:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _answering(self, delta: int) -> None:
        with self._idle:
            self._in_flight += delta
            self._idle.notify_all()

    def handle(self, delivery: Delivery) -> tuple[int, bytes, str]:
        """Verify and forward one delivery; return the status, body and type to answer."""
        if self.verifier is not None:
            try:
                delivery.event = self.verifier.verify(dict(delivery.headers), delivery.body)
            except WebhookVerificationError as exc:
                delivery.error = exc
        refused = delivery.error is not None and not self.forward_unverified
        if refused:
            assert delivery.error is not None
            body = json.dumps({"reason": delivery.error.reason.value}).encode()
            return self._done(delivery, 400, body, "application/json")
        if self._forward is None or self.forward_to is None:
            return self._done(delivery, 200, b'{"received": true}', "application/json")
        headers = [(k, v) for k, v in delivery.headers if k.lower() not in _HOP_BY_HOP]
        started = time.perf_counter()
        try:
            response = self._forward.post(self.forward_to, content=delivery.body, headers=headers)
        except httpx.HTTPError as exc:
            delivery.forward_error = repr(exc)
            return self._done(delivery, 502, b'{"forward": "failed"}', "application/json")
        finally:
            delivery.forward_ms = (time.perf_counter() - started) * 1000
        delivery.forwarded_status = response.status_code
        content_type = response.headers.get("content-type", "application/octet-stream")
        return self._done(delivery, response.status_code, response.content, content_type)

    def _done(
        self, delivery: Delivery, status: int, body: bytes, content_type: str
    ) -> tuple[int, bytes, str]:
        delivery.answered = status
        self.on_delivery(delivery)
        return status, body, content_type


def _read_chunked(rfile: Any) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        size = int(rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            while rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            return b"".join(chunks)
        total += size
        if total > MAX_BODY_BYTES:
            raise ValueError("body too large")
        chunks.append(rfile.read(size))
        rfile.readline()


def _make_server(host: str, port: int, listener: Listener) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "genhook-listen"

        def do_POST(self) -> None:
            listener._answering(+1)
            try:
                self._receive()
            finally:
                listener._answering(-1)

        def _receive(self) -> None:
            try:
                if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                    body = _read_chunked(self.rfile)
                else:
                    length = int(self.headers.get("Content-Length") or 0)
                    if length > MAX_BODY_BYTES:
                        raise ValueError("body too large")
                    body = self.rfile.read(length) if length > 0 else b""
            except ValueError:
                self._answer(413, b'{"error": "body too large or malformed"}', "application/json")
                self.close_connection = True
                return
            delivery = Delivery(
                received_at=time.time(),
                method=self.command,
                path=self.path,
                headers=list(self.headers.items()),
                body=body,
            )
            self._answer(*listener.handle(delivery))

        def _answer(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()

        def log_message(self, format: str, *args: Any) -> None:
            pass  # deliveries are reported through on_delivery instead

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    return Server((host, port), Handler)
