"""Fair delivery against hostile receivers on loopback: a hanging destination cannot hold
the senders, and a dead one is backed off as a whole and probed back to health."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from sqlalchemy import select

from genhook.config import Settings
from genhook.db import Database, WebhookAttempt, WebhookDelivery
from genhook.sender.destinations import list_destinations
from genhook.sender.fairness import destination_of
from genhook.wiring import webhook_service
from tests.support.webhook_receiver import (
    Receiver,
    enqueue,
    status,
    terminal_task,
    two_accounts,
    wait_until,
    webhook_settings,
)


@pytest.fixture
async def env(tmp_path: Path, database_url: str) -> AsyncIterator[tuple[Settings, Database]]:
    settings = webhook_settings(
        tmp_path,
        database_url,
        webhook_concurrency=16,
        webhook_destination_max_in_flight=3,
        webhook_timeout_seconds=20.0,
    )
    db = await two_accounts(database_url)
    yield settings, db
    await db.dispose()


async def statuses(db: Database, ids: list[str]) -> list[str]:
    async with db.read() as session:
        rows = await session.scalars(select(WebhookDelivery).where(WebhookDelivery.id.in_(ids)))
        return [row.status for row in rows]


async def test_a_hanging_destination_does_not_hold_the_others(
    env: tuple[Settings, Database],
) -> None:
    settings, db = env
    release = asyncio.Event()
    in_flight = 0
    most = 0

    async def hang(_: web.Request, __: int) -> web.StreamResponse:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        try:
            await release.wait()
        finally:
            in_flight -= 1
        return web.Response(status=200)

    hanging = await Receiver(hang).start()
    healthy = await Receiver(status(200)).start()
    stop = asyncio.Event()
    run: asyncio.Task[None] | None = None
    try:
        # The hanging receiver's deliveries are due first, and outnumber the senders.
        stuck = [
            await enqueue(db, terminal_task(f"t_hang_{i}", f"http://127.0.0.1:{hanging.port}/"))
            for i in range(40)
        ]
        fine = [
            await enqueue(
                db,
                terminal_task(
                    f"t_ok_{i}", f"http://127.0.0.1:{healthy.port}/h", account_id="acct_2"
                ),
            )
            for i in range(30)
        ]
        run = asyncio.create_task(webhook_service(settings, db).run(stop))

        async def healthy_done() -> bool:
            return await statuses(db, fine) == ["delivered"] * 30

        await wait_until(healthy_done)
        # Every healthy delivery went out while the hanging receiver still held what it
        # had: never more than its destination's limit.
        assert not release.is_set()
        assert len(hanging.received) == 3
        assert most == 3
        release.set()

        async def stuck_done() -> bool:
            return await statuses(db, stuck) == ["delivered"] * 40

        await wait_until(stuck_done, timeout=60.0)
        assert most == 3
        assert len(hanging.received) == 40  # each owed attempt, once
    finally:
        release.set()
        stop.set()
        if run is not None:
            await run
        await hanging.stop()
        await healthy.stop()


async def test_a_dead_destination_is_backed_off_and_probed_back(
    env: tuple[Settings, Database],
) -> None:
    settings, db = env
    settings = settings.model_copy(
        update={
            "webhook_breaker_failures": 3,
            "webhook_breaker_cooldown_seconds": 0.5,
            "webhook_retry_max_attempts": 6,
            "webhook_destination_max_in_flight": 1,
        }
    )
    # A port nothing listens on (yet).
    probe = await Receiver(status(200)).start()
    port = probe.port
    await probe.stop()
    url = f"http://127.0.0.1:{port}/hook"
    ids = [await enqueue(db, terminal_task(f"t_dead_{i}", url)) for i in range(6)]
    stop = asyncio.Event()
    run = asyncio.create_task(webhook_service(settings, db).run(stop))
    runner: web.AppRunner | None = None
    try:

        async def opened() -> bool:
            view = await list_destinations(db, account_id="acct_1")
            return any(d.state == "open" for d in view.data)

        await wait_until(opened)
        [dest] = (await list_destinations(db, account_id="acct_1")).data
        assert dest.destination == destination_of(url) == f"http://127.0.0.1:{port}"
        assert dest.consecutive_failures >= 3
        assert dest.retry_at is not None and dest.pending == 6
        assert (await list_destinations(db, account_id="acct_2")).data == []

        # The receiver comes back: a half-open probe finds it and the circuit closes.
        received: list[bytes] = []

        async def answer(request: web.Request) -> web.StreamResponse:
            received.append(await request.read())
            return web.Response(status=200)

        app = web.Application()
        app.router.add_post("/hook", answer)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()

        async def delivered() -> bool:
            return await statuses(db, ids) == ["delivered"] * 6

        await wait_until(delivered)
        async with db.read() as session:
            log = list(
                await session.scalars(
                    select(WebhookAttempt)
                    .where(WebhookAttempt.delivery_id.in_(ids))
                    .order_by(WebhookAttempt.id)
                )
            )
        errors = [a.error or "" for a in log]
        assert any(e.endswith("(destination circuit opened)") for e in errors)
        assert any("half-open probe" in e for e in errors)
        # No delivery spent its retry budget while the destination was backed off.
        assert len(received) == 6

        async def closed() -> bool:
            [d] = (await list_destinations(db, account_id="acct_1")).data
            return d.state == "closed"

        await wait_until(closed)
    finally:
        stop.set()
        await run
        if runner is not None:
            await runner.cleanup()
