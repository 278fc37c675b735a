"""Webhooks through the real app: submit with webhook_url -> signed callback, JWKS, the
attempt log and redelivery endpoints."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from nacl.signing import VerifyKey
from sqlalchemy import update

from genhook.accounts import NewAccount, create_account
from genhook.api import AppState, build_state, create_app
from genhook.db import Database, WebhookDelivery
from genhook.engines.registry import build_registry
from genhook.net._policy import DEV_MODE_HINT
from genhook.sender.keys import ensure_signing_key, load_encryption_key
from genhook.signature import b64url_decode, hmac_hex
from genhook.tasks import Worker
from genhook.wiring import webhook_service
from tests.support.images import data_url
from tests.support.webhook_receiver import (
    PATIENT_TIMEOUT_SECONDS,
    Receiver,
    create_schema,
    sequence,
    status,
    webhook_settings,
)

MODEL = "test/fake-edit"


@dataclass
class App:
    state: AppState
    client: httpx.AsyncClient
    account: NewAccount
    worker: Worker

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.account.api_key}"}


@pytest.fixture
async def app(tmp_path: Path, database_url: str) -> AsyncIterator[App]:
    settings = webhook_settings(
        tmp_path,
        database_url,
        extra_engines=["tests.support.engines:register"],
        webhook_timeout_seconds=PATIENT_TIMEOUT_SECONDS,
    )
    db = Database(database_url)
    await create_schema(db)
    state = build_state(settings, registry=build_registry(settings), db=db)
    asgi = create_app(state)
    account = await create_account(db, "test", encryption_key=load_encryption_key(settings))
    await ensure_signing_key(db, settings)
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=asgi), base_url="http://testserver"
    )
    worker = Worker.sharing(state, worker_id="w-test")
    yield App(state, client, account, worker)
    await client.aclose()
    await db.dispose()


async def run_service(app: App, until: Any, timeout: float = 20.0) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(webhook_service(app.state.settings, app.state.db).run(stop))
    try:
        async with asyncio.timeout(timeout):
            while not await until():
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        await task


async def test_submit_to_signed_callback(app: App) -> None:
    receiver = await Receiver(status(200)).start()
    try:
        url = f"http://127.0.0.1:{receiver.port}/hook"
        ok = await app.client.post(
            "/api/v1/model/generateImage",
            json={
                "model": MODEL,
                "prompt": "make it pop",
                "images": [data_url()],
                "webhook_url": url,
            },
            headers=app.headers,
        )
        assert ok.status_code == 200, ok.text
        assert "webhook_url" not in ok.json()
        failed = await app.client.post(
            "/api/v1/model/generateImage",
            json={"model": MODEL, "prompt": "fail", "images": [data_url()], "webhook_url": url},
            headers=app.headers,
        )
        assert failed.status_code == 200, failed.text
        while await app.worker.run_turn():
            pass

        async def both() -> bool:
            return len(receiver.received) >= 2

        await run_service(app, both)
        jwks = (await app.client.get("/api/v1/webhooks/jwks.json")).json()
        bodies = {}
        for got in receiver.received:
            h = got.headers
            kid = h["X-Service-Webhook-Key-Id"]
            [jwk] = [k for k in jwks["keys"] if k["kid"] == kid]
            message = h["X-Service-Webhook-Timestamp"].encode() + b"." + got.body
            VerifyKey(b64url_decode(jwk["x"])).verify(
                message, b64url_decode(h["X-Service-Webhook-Signature-Ed25519"])
            )
            assert h["X-Service-Webhook-Signature"] == hmac_hex(
                app.account.signing_secret, got.body
            )
            body = json.loads(got.body)
            assert h["X-Service-Webhook-Id"] == body["session_id"]
            bodies[body["session_id"]] = body
        good = bodies[ok.json()["id"]]
        assert good["event_type"] == "image.task.terminal"
        assert good["status"] == "OK" and good["payload"]["status"] == "completed"
        result = (
            await app.client.get(f"/api/v1/model/result/{good['session_id']}", headers=app.headers)
        ).json()
        assert good["payload"]["outputs"] == result["outputs"]
        assert good["payload"]["id"] == result["id"] and good["payload"]["model"] == MODEL
        bad = bodies[failed.json()["id"]]
        assert bad["status"] == "ERROR" and bad["payload"]["status"] == "failed"
        assert isinstance(bad["payload"]["error_code"], int) and bad["error"]
    finally:
        await receiver.stop()


async def test_submit_refuses_bad_webhook_urls(app: App) -> None:
    app.state.policy.allow_private = False
    https = "webhook_url must use https"
    public = "webhook_url is not a routable public address"
    cases = {
        # example.test does not resolve here: not public either, and the refusal says both.
        "http://example.test/hook": [https, public],
        "http://127.0.0.1:4242/hook": [https, public],
        "https://127.0.0.1/hook": [public],
        "https://a.test/" + "x" * 1024: ["webhook_url exceeds the 1024-character limit"],
    }
    for url, messages in cases.items():
        response = await app.client.post(
            "/api/v1/model/generateImage",
            json={"model": MODEL, "prompt": "p", "images": [data_url()], "webhook_url": url},
            headers=app.headers,
        )
        assert response.status_code == 400
        # A loopback receiver is what `genhook serve --dev` accepts: the message says so.
        hint = DEV_MODE_HINT if "127.0.0.1" in url else ""
        assert response.json()["message"] == "; ".join(messages) + hint
        assert response.json()["errors"] == [
            {"field": "webhook_url", "message": message} for message in messages
        ]


async def test_jwks_is_public_and_cacheable(app: App) -> None:
    response = await app.client.get("/api/v1/webhooks/jwks.json")
    assert response.status_code == 200
    assert "max-age" in response.headers["cache-control"]
    [key] = response.json()["keys"]
    assert set(key) == {"kty", "crv", "x", "use", "alg", "kid"}
    assert len(b64url_decode(key["x"])) == 32


async def test_attempt_log_and_redelivery(app: App) -> None:
    receiver = await Receiver(sequence(500, 500, 200)).start()
    settings = app.state.settings.model_copy(update={"webhook_retry_max_attempts": 2})
    app.state.settings = settings
    try:
        url = f"http://127.0.0.1:{receiver.port}/hook"
        task_id = (
            await app.client.post(
                "/api/v1/model/generateImage",
                json={"model": MODEL, "prompt": "p", "images": [data_url()], "webhook_url": url},
                headers=app.headers,
            )
        ).json()["id"]
        while await app.worker.run_turn():
            pass

        async def undeliverable() -> bool:
            async with app.state.db.read() as session:
                rows = (
                    await session.execute(
                        WebhookDelivery.__table__.select().where(WebhookDelivery.task_id == task_id)
                    )
                ).all()
            return bool(rows) and rows[0].status == "undeliverable"

        await run_service(app, undeliverable)
        assert (await app.client.get("/api/v1/webhooks/deliveries")).status_code == 401
        page = (
            await app.client.get(
                "/api/v1/webhooks/deliveries",
                params={"session_id": task_id, "status": "undeliverable"},
                headers=app.headers,
            )
        ).json()
        [d] = page["data"]
        assert d["session_id"] == task_id and d["attempts"] == 2
        assert [(a["number"], a["status_code"]) for a in d["attempt_log"]] == [(1, 500), (2, 500)]
        assert d["attempt_log"][0]["response_excerpt"] == "answer 500"
        other = await create_account(app.state.db, "other")
        not_yours = await app.client.post(
            f"/api/v1/webhooks/deliveries/{d['id']}/redeliver",
            headers={"Authorization": f"Bearer {other.api_key}"},
        )
        assert not_yours.status_code == 404
        again = await app.client.post(
            f"/api/v1/webhooks/deliveries/{d['id']}/redeliver", headers=app.headers
        )
        assert again.status_code == 200, again.text
        assert again.json()["status"] == "pending" and again.json()["redeliveries"] == 1

        async def delivered() -> bool:
            async with app.state.db.read() as session:
                row = await session.get(WebhookDelivery, d["id"])
                return row is not None and row.status == "delivered"

        await run_service(app, delivered)
        final = (
            await app.client.get(
                "/api/v1/webhooks/deliveries", params={"session_id": task_id}, headers=app.headers
            )
        ).json()["data"][0]
        log = final["attempt_log"]
        # A redelivery adds attempts after the two failed ones and ends with the answered
        # one; one that got no answer (a timeout, a reset) is logged as such, then retried.
        assert [(a["number"], a["status_code"]) for a in log[:2]] == [(1, 500), (2, 500)], log
        assert [a["number"] for a in log] == list(range(1, len(log) + 1)), log
        assert log[-1]["status_code"] == 200 and log[-1]["error"] is None, log
        assert all(a["status_code"] is None and a["error"] for a in log[2:-1]), log
        assert final["status"] == "delivered"
        # While an attempt is in flight, redelivery is refused.
        async with app.state.db.write() as session:
            await session.execute(
                update(WebhookDelivery)
                .where(WebhookDelivery.id == d["id"])
                .values(lease_owner="x", lease_expires_at=2**62)
            )
        busy = await app.client.post(
            f"/api/v1/webhooks/deliveries/{d['id']}/redeliver", headers=app.headers
        )
        assert busy.status_code == 409
    finally:
        await receiver.stop()
