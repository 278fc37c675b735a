"""Bulk redelivery through the real app: bounded, idempotent, per account, filtered by
destination, and replayed attempts marked in the attempt log."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from genhook.accounts import NewAccount, create_account
from genhook.api import AppState, build_state, create_app
from genhook.db import Database
from genhook.engines.registry import build_registry
from genhook.sender.keys import ensure_signing_key
from genhook.wiring import webhook_service
from tests.support.webhook_receiver import (
    PATIENT_TIMEOUT_SECONDS,
    Receiver,
    create_schema,
    enqueue,
    sequence,
    terminal_task,
    webhook_settings,
)

SINCE = "2020-01-01T00:00:00Z"


@dataclass
class App:
    state: AppState
    client: httpx.AsyncClient
    account: NewAccount
    other: NewAccount

    def headers(self, account: NewAccount | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {(account or self.account).api_key}"}


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
    account = await create_account(db, "test")
    other = await create_account(db, "other")
    await ensure_signing_key(db, settings)
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=asgi), base_url="http://testserver"
    )
    yield App(state, client, account, other)
    await client.aclose()
    await db.dispose()


async def deliver_until(app: App, until: Any) -> None:
    stop = asyncio.Event()
    run = asyncio.create_task(webhook_service(app.state.settings, app.state.db).run(stop))
    try:
        async with asyncio.timeout(20):
            while not await until():
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        await run


async def deliveries(app: App) -> list[dict[str, Any]]:
    response = await app.client.get("/api/v1/webhooks/deliveries", headers=app.headers())
    assert response.status_code == 200, response.text
    data: list[dict[str, Any]] = response.json()["data"]
    return data


async def redeliver(app: App, account: NewAccount | None = None, **body: Any) -> httpx.Response:
    return await app.client.post(
        "/api/v1/webhooks/deliveries/redeliver", json=body, headers=app.headers(account)
    )


async def test_bulk_redelivery_is_bounded_idempotent_and_marked(app: App) -> None:
    gone = await Receiver(sequence(410, 410, 410, 200)).start()
    kept = await Receiver(sequence(410, 200)).start()
    try:
        account = app.account.account_id
        # One endpoint each: a 410 stops the pending deliveries of its own endpoint only.
        for i in range(3):
            await enqueue(
                app.state.db,
                terminal_task(f"t_a{i}", f"http://127.0.0.1:{gone.port}/h{i}", account_id=account),
            )
        await enqueue(
            app.state.db,
            terminal_task("t_b", f"http://127.0.0.1:{kept.port}/h", account_id=account),
        )

        async def all_given_up() -> bool:
            return {d["status"] for d in await deliveries(app)} == {"undeliverable"}

        await deliver_until(app, all_given_up)

        # Another account sees none of these.
        other = await redeliver(app, app.other, since=SINCE)
        assert other.status_code == 200 and other.json()["redelivered"] == 0
        # Bounded, oldest first, and only the destination asked for.
        first = await redeliver(
            app, since=SINCE, destination=f"http://127.0.0.1:{gone.port}", limit=2
        )
        assert first.status_code == 200, first.text
        assert first.json()["redelivered"] == 2 and first.json()["more"] is True
        # The same request again: those two are queued already, so only the third matches.
        again = await redeliver(
            app, since=SINCE, destination=f"http://127.0.0.1:{gone.port}/other", limit=2
        )
        assert again.json()["redelivered"] == 1 and again.json()["more"] is False
        assert await redeliver(app, since=SINCE, destination=f"http://127.0.0.1:{gone.port}")
        repeat = await redeliver(app, since=SINCE, destination=f"http://127.0.0.1:{gone.port}")
        assert repeat.json() == {"redelivered": 0, "ids": [], "more": False}

        async def three_delivered() -> bool:
            return sum(d["status"] == "delivered" for d in await deliveries(app)) == 3

        await deliver_until(app, three_delivered)
        by_session = {d["session_id"]: d for d in await deliveries(app)}
        assert by_session["t_b"]["status"] == "undeliverable"
        replayed = [by_session[f"t_a{i}"] for i in range(3)]
        for d in replayed:
            assert d["redeliveries"] == 1
            assert [a["replay"] for a in d["attempt_log"]] == [False, True]
            assert [a["number"] for a in d["attempt_log"]] == [1, 2]
        assert len(gone.received) == 6
    finally:
        await gone.stop()
        await kept.stop()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"since": "yesterday"}, "since"),
        ({"since": "2026-11-22T08:00:00"}, "since"),
        ({}, "since"),
        ({"since": SINCE, "limit": 5000}, "limit"),
        ({"since": SINCE, "status": "pending"}, "status"),
    ],
)
async def test_bulk_redelivery_refuses_bad_filters(
    app: App, body: dict[str, Any], field: str
) -> None:
    response = await redeliver(app, **body)
    assert response.status_code == 400, response.text
    assert [e["field"] for e in response.json()["errors"]] == [field]


async def test_cli_bulk_redelivery_and_standard_webhooks(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    import typer
    from sqlalchemy import update
    from typer.testing import CliRunner

    from genhook.cli.webhooks import deliveries_app, standard_webhooks
    from genhook.db import Account, WebhookDelivery

    settings = app.state.settings
    monkeypatch.setenv("GENHOOK_DATABASE_URL", settings.resolved_database_url)
    monkeypatch.setenv("GENHOOK_DATA_DIR", str(settings.data_dir))
    account = app.account.account_id
    delivery_id = await enqueue(
        app.state.db, terminal_task("t_cli", "http://127.0.0.1:9/h", account_id=account)
    )
    async with app.state.db.write() as session:
        await session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.id == delivery_id)
            .values(status="undeliverable", attempts=10)
        )
    runner = CliRunner()
    toggle = typer.Typer()
    toggle.command()(standard_webhooks)

    def invoke() -> None:
        bad = runner.invoke(deliveries_app, ["redeliver-all", "--since", "yesterday"])
        assert bad.exit_code == 1 and "since" in bad.output
        done = runner.invoke(
            deliveries_app,
            ["redeliver-all", "--since", SINCE, "--account", account, "--json"],
        )
        assert done.exit_code == 0, done.output
        assert json.loads(done.output)["ids"] == [delivery_id]
        again = runner.invoke(deliveries_app, ["redeliver-all", "--since", SINCE, "--json"])
        assert json.loads(again.output)["redelivered"] == 0
        on = runner.invoke(toggle, [account, "on"])
        assert on.exit_code == 0, on.output
        assert runner.invoke(toggle, [account, "maybe"]).exit_code == 2
        assert runner.invoke(toggle, ["acct_nope", "on"]).exit_code == 1

    await asyncio.to_thread(invoke)
    async with app.state.db.read() as session:
        row = await session.get(Account, account)
        assert row is not None and row.standard_webhooks is True
        delivery = await session.get(WebhookDelivery, delivery_id)
        assert delivery is not None and delivery.status == "pending"
        assert (delivery.round_start, delivery.redeliveries) == (10, 1)
