"""The examples and the verification recipes of docs/webhooks.md actually work.

Every recipe verifies a delivery signed here, and refuses a tampered one. The recipe files
must appear verbatim in the docs, so the documented code is the tested code.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import importlib.util
import json
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import uvicorn
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DOCS = (
    (ROOT / "docs" / "webhooks.md").read_text() if (ROOT / "docs" / "webhooks.md").exists() else ""
)
KEY = Ed25519PrivateKey.generate()
SECRET = "whsec_recipes"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


X = b64url(KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))
JWKS = {
    "keys": [{"kty": "OKP", "crv": "Ed25519", "use": "sig", "alg": "EdDSA", "kid": "k1", "x": X}]
}


def delivery(sid: str = "task_r", mode: str = "migration") -> tuple[dict[str, str], bytes]:
    body = json.dumps(
        {
            "session_id": sid,
            "event_type": "image.task.terminal",
            "status": "OK",
            "created_at": 1,
            "payload": {"model": "genhook/image-edit", "status": "completed", "outputs": ["u"]},
        },
        indent=2,
    ).encode()
    ts = str(int(time.time()))
    sig = b64url(KEY.sign(ts.encode() + b"." + body))
    headers = {
        "x-service-webhook-id": sid,
        "x-service-webhook-event": "image.task.terminal",
        "x-service-webhook-timestamp": ts,
        "x-service-webhook-key-id": "k1",
    }
    mac = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    if mode == "migration":
        headers["x-service-webhook-signature"] = mac
        headers["x-service-webhook-signature-ed25519"] = sig
    elif mode == "ed25519":
        headers["x-service-webhook-signature"] = sig
    else:
        headers["x-service-webhook-signature"] = mac
    return headers, body


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["verify_without_sdk.py", "verify_node.mjs", "verify_openssl.sh"])
def test_recipes_are_in_the_docs_verbatim(name):
    assert (EXAMPLES / name).read_text().strip() in DOCS


@pytest.mark.parametrize("mode", ["migration", "ed25519", "hmac"])
def test_python_recipe_without_sdk(mode):
    recipe = load(EXAMPLES / "verify_without_sdk.py", "verify_without_sdk")
    headers, body = delivery(mode=mode)
    assert recipe.verify_delivery(headers, body, JWKS, SECRET)["session_id"] == "task_r"
    with pytest.raises(ValueError):
        recipe.verify_delivery(headers, body.replace(b'"u"', b'"v"'), JWKS, SECRET)


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
@pytest.mark.parametrize("mode", ["migration", "ed25519", "hmac"])
def test_node_recipe(mode):
    headers, body = delivery(mode=mode)

    def run(raw: bytes) -> subprocess.CompletedProcess[str]:
        data = {
            "headers": headers,
            "body_base64": base64.b64encode(raw).decode(),
            "jwks": JWKS,
            "hmac_secret": SECRET,
        }
        return subprocess.run(
            ["node", str(EXAMPLES / "verify_node.mjs")],
            input=json.dumps(data),
            capture_output=True,
            text=True,
            timeout=30,
        )

    good = run(body)
    assert good.returncode == 0 and good.stdout.strip() == "verified task_r OK", (
        good.stdout + good.stderr
    )
    bad = run(body + b"\n")
    assert bad.returncode == 1 and "mismatch" in bad.stdout


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_openssl_recipe(tmp_path):
    headers, body = delivery()
    path = tmp_path / "body.json"
    path.write_bytes(body)
    args = [
        "sh",
        str(EXAMPLES / "verify_openssl.sh"),
        str(path),
        headers["x-service-webhook-timestamp"],
        headers["x-service-webhook-signature-ed25519"],
        X,
    ]
    good = subprocess.run(args, capture_output=True, text=True, timeout=30)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "Signature Verified Successfully" in good.stdout
    path.write_bytes(body.replace(b"OK", b"KO"))
    bad = subprocess.run(args, capture_output=True, text=True, timeout=30)
    assert bad.returncode != 0
    stale = [*args[:3], str(int(headers["x-service-webhook-timestamp"]) - 3600), *args[4:]]
    path.write_bytes(body)
    assert subprocess.run(stale, capture_output=True, text=True, timeout=30).returncode != 0
    # The documented HMAC one-liner gives the header's value.
    mac = subprocess.run(
        f"openssl dgst -sha256 -hmac '{SECRET}' -hex <'{path}' | sed 's/^.* //'",
        shell=True,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.strip()
    assert mac == hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()


class _Jwks:
    def __init__(self) -> None:
        payload = json.dumps(JWKS).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()


@pytest.fixture
def receiver(tmp_path, monkeypatch) -> Iterator[tuple[str, ModuleType]]:
    """examples/fastapi_receiver.py served by uvicorn on 127.0.0.1, keys from a local JWKS."""
    jwks = _Jwks()
    monkeypatch.setenv("GENHOOK_BASE_URL", jwks.base_url)
    monkeypatch.setenv("GENHOOK_SIGNING_SECRET", SECRET)
    monkeypatch.setenv("RECEIVER_DEDUP_DB", str(tmp_path / "seen.db"))
    module = load(EXAMPLES / "fastapi_receiver.py", "fastapi_receiver")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(module.app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/hooks/genhook", module
    server.should_exit = True
    thread.join(10)
    jwks.server.shutdown()
    jwks.server.server_close()


def test_fastapi_receiver_example(receiver):
    url, module = receiver
    processed: list[str] = []
    failures = {"task_flaky": 1}

    async def record(event: Any) -> None:
        if failures.get(event.session_id, 0) > 0:
            failures[event.session_id] -= 1
            raise RuntimeError("downstream outage")
        processed.append(event.session_id)

    module.process = record
    headers, body = delivery("task_ok")
    with httpx.Client() as client:
        assert client.post(url, content=body, headers=headers).json() == {"status": "accepted"}
        assert client.post(url, content=body, headers=headers).json() == {"status": "duplicate"}
        refused = client.post(url, content=body.replace(b"OK", b"KO"), headers=headers)
        assert refused.status_code == 400 and "bad_signature" in refused.text
        flaky_headers, flaky_body = delivery("task_flaky", mode="migration")
        assert client.post(url, content=flaky_body, headers=flaky_headers).json() == {
            "status": "accepted"
        }
        # Processing fails after the 200, so the receiver drops its dedup entry and the
        # service's next retry is processed; retry like the service does until it is.
        deadline = time.monotonic() + 10
        answer = "duplicate"
        while answer == "duplicate" and time.monotonic() < deadline:
            time.sleep(0.02)
            answer = client.post(url, content=flaky_body, headers=flaky_headers).json()["status"]
        assert answer == "accepted"
        while len(processed) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert processed == ["task_ok", "task_flaky"]
