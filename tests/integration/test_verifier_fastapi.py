"""The FastAPI dependency: raw bytes reach the verifier, refusals become 400 with the reason."""

from __future__ import annotations

import base64
import json
import time

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from fastapi import Depends, FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from genhook.receiver import (
    MemoryDedupStore,
    WebhookEvent,
    WebhookVerificationError,
    WebhookVerifier,
    verify_request,
    webhook_dependency,
)


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


KEY = Ed25519PrivateKey.generate()
X = b64url(KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))
VERIFIER = WebhookVerifier(jwks={"keys": [{"kty": "OKP", "crv": "Ed25519", "x": X, "kid": "k1"}]})


def signed(sid: str = "task_9") -> tuple[bytes, dict[str, str]]:
    # Odd spacing: a framework that re-serialized JSON before verifying would fail here.
    body = (
        '{"session_id":  "' + sid + '", "event_type": "image.task.terminal", "status": "OK",'
        ' "created_at": 5, "payload": {"model": "m", "status": "completed", "outputs": ["u"]}}'
    ).encode()
    ts = str(int(time.time()))
    return body, {
        "Content-Type": "application/json",
        "X-Service-Webhook-Id": sid,
        "X-Service-Webhook-Event": "image.task.terminal",
        "X-Service-Webhook-Timestamp": ts,
        "X-Service-Webhook-Key-Id": "k1",
        "X-Service-Webhook-Signature-Ed25519": b64url(KEY.sign(ts.encode() + b"." + body)),
    }


def fastapi_app() -> tuple[FastAPI, list[WebhookEvent]]:
    app = FastAPI()
    processed: list[WebhookEvent] = []
    dedup = MemoryDedupStore()

    @app.post("/hooks/genhook")
    async def receive(
        event: WebhookEvent = Depends(webhook_dependency(VERIFIER)),
    ) -> dict[str, bool]:
        if dedup.first_time(event.session_id):
            processed.append(event)
            return {"duplicate": False}
        return {"duplicate": True}

    return app, processed


async def test_fastapi_dependency_verifies_and_dedups():
    app, processed = fastapi_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        body, headers = signed()
        first = await c.post("/hooks/genhook", content=body, headers=headers)
        again = await c.post("/hooks/genhook", content=body, headers=headers)
        assert first.status_code == again.status_code == 200
        assert first.json() == {"duplicate": False} and again.json() == {"duplicate": True}
        assert [e.payload.outputs for e in processed] == [["u"]]

        tampered = await c.post(
            "/hooks/genhook", content=body.replace(b'"u"', b'"v"'), headers=headers
        )
        assert tampered.status_code == 400
        assert tampered.json()["detail"].startswith("bad_signature")
        unsigned = await c.post(
            "/hooks/genhook", content=body, headers={"Content-Type": "application/json"}
        )
        assert unsigned.status_code == 400 and unsigned.json()["detail"].startswith(
            "missing_header"
        )
    assert len(processed) == 1


async def test_plain_starlette_verify_request():
    async def hook(request: Request) -> JSONResponse:
        try:
            event = await verify_request(VERIFIER, request)
        except WebhookVerificationError as exc:
            return JSONResponse({"reason": exc.reason.value}, status_code=400)
        return JSONResponse({"task": event.task_id, "ok": event.ok})

    app = Starlette(routes=[Route("/hook", hook, methods=["POST"])])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        body, headers = signed("task_s")
        response = await c.post("/hook", content=body, headers=headers)
        assert response.json() == {"task": "task_s", "ok": True}
        headers["X-Service-Webhook-Id"] = "task_other"
        response = await c.post("/hook", content=body, headers=headers)
        assert response.status_code == 400 and response.json() == {"reason": "id_mismatch"}
    assert json.loads(body)["session_id"] == "task_s"
