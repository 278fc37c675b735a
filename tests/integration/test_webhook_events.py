"""Opt-in progress events through the real app and worker: the processing event arrives
before the terminal one, only when asked for, and bad ``webhook_events`` get a 400."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from genhook.accounts import NewAccount, create_account
from genhook.api import AppState, build_state, create_app
from genhook.db import Database
from genhook.engines.registry import build_registry
from genhook.sender.keys import ensure_signing_key
from genhook.tasks import Worker
from genhook.wiring import webhook_service
from tests.support.images import data_url
from tests.support.webhook_receiver import Receiver, create_schema, status, webhook_settings

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

    async def submit(self, **extra: Any) -> httpx.Response:
        body = {"model": MODEL, "prompt": "sleep=2 go", "images": [data_url()], **extra}
        return await self.client.post(
            "/api/v1/model/generateImage", json=body, headers=self.headers
        )


@pytest.fixture
async def app(tmp_path: Path, database_url: str) -> AsyncIterator[App]:
    settings = webhook_settings(
        tmp_path, database_url, extra_engines=["tests.support.engines:register"]
    )
    db = Database(database_url)
    await create_schema(db)
    state = build_state(settings, registry=build_registry(settings), db=db)
    asgi = create_app(state)
    account = await create_account(db, "test")
    await ensure_signing_key(db, settings)
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=asgi), base_url="http://testserver"
    )
    worker = Worker.sharing(state, worker_id="w-test")
    yield App(state, client, account, worker)
    await client.aclose()
    await db.dispose()


async def run_until(app: App, receiver: Receiver, count: int) -> None:
    stop = asyncio.Event()
    service = webhook_service(app.state.settings, app.state.db)
    running = asyncio.create_task(service.run(stop))
    try:
        while service.dispatcher is None:
            await asyncio.sleep(0.01)
        await service.dispatcher.started.wait()
        while await app.worker.run_turn():
            pass
        await receiver.wait_for(count, timeout=20)
        await asyncio.sleep(0.3)  # anything more would arrive now
    finally:
        stop.set()
        await running


async def test_processing_event_arrives_first_when_asked_for(app: App) -> None:
    hold = asyncio.Event()

    async def slow_processing(request: web.Request, _: int) -> web.StreamResponse:
        # The processing event is still on the wire when the task ends: the terminal
        # event must wait for it.
        if json.loads(await request.read())["event_type"].endswith(".processing"):
            await asyncio.sleep(0.8)
        hold.set()
        return web.Response(status=200)

    receiver = await Receiver(slow_processing).start()
    plain = await Receiver(status(200)).start()
    try:
        url = f"http://127.0.0.1:{receiver.port}/hook"
        asked = await app.submit(webhook_url=url, webhook_events=["processing", "terminal"])
        assert asked.status_code == 200, asked.text
        assert "webhook_events" not in asked.json()
        default = await app.submit(webhook_url=f"http://127.0.0.1:{plain.port}/hook")
        assert default.status_code == 200, default.text
        await run_until(app, receiver, 2)
        bodies = [json.loads(r.body) for r in receiver.received]
        assert [b["event_type"] for b in bodies] == ["image.task.processing", "image.task.terminal"]
        assert [b["session_id"] for b in bodies] == [asked.json()["id"]] * 2
        assert bodies[0]["payload"]["status"] == "processing"
        assert bodies[1]["payload"]["status"] == "completed"
        events = [r.headers["X-Service-Webhook-Event"] for r in receiver.received]
        assert events == ["image.task.processing", "image.task.terminal"]
        # The default is the contract's single terminal event.
        assert [json.loads(r.body)["event_type"] for r in plain.received] == ["image.task.terminal"]
        page = (
            await app.client.get(
                "/api/v1/webhooks/deliveries",
                params={"session_id": asked.json()["id"]},
                headers=app.headers,
            )
        ).json()["data"]
        assert sorted(d["status"] for d in page) == ["delivered", "delivered"]
        processing = next(d for d in page if d["event_type"].endswith(".processing"))
        replay = await app.client.post(
            f"/api/v1/webhooks/deliveries/{processing['id']}/redeliver", headers=app.headers
        )
        assert replay.status_code == 409, replay.text
    finally:
        await receiver.stop()
        await plain.stop()


@pytest.mark.parametrize(
    "extra",
    [
        {"webhook_events": ["processing"]},
        {"webhook_events": ["terminal", "started"]},
        {"webhook_events": "processing"},
        {"webhook_events": ["terminal", "terminal"]},
        {"webhook_events": ["processing", "terminal"], "webhook_url": None},
    ],
)
async def test_bad_webhook_events_are_refused(app: App, extra: dict[str, Any]) -> None:
    extra.setdefault("webhook_url", "http://127.0.0.1:9/hook")
    response = await app.submit(**extra)
    assert response.status_code == 400, response.text
    assert [e["field"] for e in response.json()["errors"]] == ["webhook_events"]
