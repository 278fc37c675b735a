"""Verifications per second of the SDK's WebhookVerifier against raw Ed25519 verify.

The ceiling is ``Ed25519PublicKey.verify`` on a prepared message and signature: the
cryptographic work every verifier must do. The SDK run does the whole job on each delivery
(header lookup, replay window, signature decoding, key lookup in a warm cache fetched from a
real JWKS endpoint on 127.0.0.1, the verify itself, JSON parsing and the id check).

    .venv/bin/python benchmarks/verify.py [--n 4000] [--rounds 25] [--min-ratio 0.8]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from genhook.receiver import WebhookVerifier


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def serve_jwks(document: dict[str, Any]) -> tuple[ThreadingHTTPServer, str]:
    payload = json.dumps(document).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/api/v1/webhooks/jwks.json"


def rate(func: Callable[[], object], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        func()
    return n / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4_000, help="verifications per round")
    parser.add_argument("--rounds", type=int, default=25, help="rounds; the best one counts")
    parser.add_argument("--min-ratio", type=float, default=0.8, help="exit 1 below this ratio")
    args = parser.parse_args()

    key = Ed25519PrivateKey.generate()
    public = key.public_key()
    x = b64url(public.public_bytes(Encoding.Raw, PublicFormat.Raw))
    server, jwks_url = serve_jwks(
        {
            "keys": [
                {"kty": "OKP", "crv": "Ed25519", "use": "sig", "alg": "EdDSA", "kid": "k1", "x": x}
            ]
        }
    )
    body = json.dumps(
        {
            "session_id": "tsk_01JD8Q3W5M7ZK2B9C4X6V8N0PQ",
            "event_type": "image.task.terminal",
            "status": "OK",
            "created_at": 1_763_800_000_000,
            "payload": {
                "id": "tsk_01JD8Q3W5M7ZK2B9C4X6V8N0PQ",
                "model": "genhook/image-edit",
                "status": "completed",
                "outputs": [
                    "https://genhook.example.com/api/v1/outputs/tsk_01JD8Q3W5M7ZK2B9C4X6V8N0PQ/0.jpeg"
                ],
                "has_nsfw_contents": [False],
                "created_at": "2025-11-22T08:26:40.000Z",
                "urls": {
                    "get": "https://genhook.example.com/api/v1/model/result/tsk_01JD8Q3W5M7ZK2B9C4X6V8N0PQ"
                },
            },
        }
    ).encode()
    ts = str(int(time.time()))
    message = ts.encode() + b"." + body
    signature = key.sign(message)
    headers = {
        "content-type": "application/json",
        "user-agent": "Service-Webhook/1.0",
        "x-service-webhook-id": "tsk_01JD8Q3W5M7ZK2B9C4X6V8N0PQ",
        "x-service-webhook-event": "image.task.terminal",
        "x-service-webhook-timestamp": ts,
        "x-service-webhook-signature": hmac.new(b"secret", body, hashlib.sha256).hexdigest(),
        "x-service-webhook-signature-ed25519": b64url(signature),
        "x-service-webhook-key-id": "k1",
    }
    verifier = WebhookVerifier(jwks_url=jwks_url, hmac_secret="secret")
    assert verifier.verify(headers, body).session_id.startswith("tsk_")  # warms the key cache

    def raw() -> None:
        public.verify(signature, message)

    def sdk() -> None:
        verifier.verify(headers, body)

    best_raw = best_sdk = 0.0
    for _ in range(args.rounds):  # interleaved, so drift in machine load hits both alike
        best_raw = max(best_raw, rate(raw, args.n))
        best_sdk = max(best_sdk, rate(sdk, args.n))
    fetches = verifier.keys.fetches if verifier.keys is not None else 0  # type: ignore[union-attr]
    server.shutdown()
    ratio = best_sdk / best_raw
    print(f"body bytes            {len(body)}")
    print(f"raw Ed25519 verify/s  {best_raw:,.0f}")
    print(f"SDK verify/s          {best_sdk:,.0f}")
    print(f"ratio                 {ratio:.1%} (target >= {args.min_ratio:.0%})")
    print(f"JWKS fetches          {fetches}")
    return 0 if ratio >= args.min_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
