"""Recovery: a sender killed mid-flight, and the reconciliation safety net."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from sqlalchemy import insert, select, text

from genhook.config import Settings
from genhook.db import Database, WebhookAttempt, WebhookDelivery, now_ms
from genhook.sender.dispatcher import Dispatcher
from genhook.sender.keys import KeyRing
from genhook.sender.queue import _sqlite as queue_sqlite
from genhook.sender.service import WebhookService
from genhook.wiring import reconciler as wired_reconciler
from genhook.wiring import webhook_service
from tests.support.webhook_receiver import (
    Receiver,
    delivery_database,
    enqueue,
    status,
    terminal_task,
    webhook_settings,
)

ROOT = Path(__file__).resolve().parents[2]

SENDER = """
import asyncio
from genhook.config import Settings
from genhook.db import Database
from genhook.sender.service import WebhookService

async def main() -> None:
    settings = Settings()
    db = Database(settings.resolved_database_url)
    await WebhookService(settings, db, lease_margin_seconds=0.5).run(asyncio.Event())

asyncio.run(main())
"""


@pytest.fixture
async def env(tmp_path: Path, database_url: str) -> AsyncIterator[tuple[Settings, Database]]:
    settings = webhook_settings(tmp_path, database_url, webhook_timeout_seconds=1.0)
    db = await delivery_database(settings)
    yield settings, db
    await db.dispose()


async def wait_status(db: Database, delivery_id: str, wanted: str, timeout: float = 20) -> None:
    async with asyncio.timeout(timeout):
        while True:
            async with db.read() as session:
                row = await session.get(WebhookDelivery, delivery_id)
                if row is not None and row.status == wanted:
                    return
            await asyncio.sleep(0.02)


async def run_until(service: WebhookService, predicate: object, timeout: float = 20) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    try:
        await asyncio.wait_for(predicate, timeout)  # type: ignore[arg-type]
    finally:
        stop.set()
        await task


async def test_sender_killed_mid_flight_delivery_still_arrives(
    env: tuple[Settings, Database], tmp_path: Path
) -> None:
    settings, db = env
    release = asyncio.Event()

    async def first_hangs(_: web.Request, n: int) -> web.StreamResponse:
        if n == 1:
            await release.wait()
        return web.Response(status=200)

    receiver = await Receiver(first_hangs).start()
    delivery_id = await enqueue(db, terminal_task("t_killed", f"http://127.0.0.1:{receiver.port}/"))
    env_vars = {
        **os.environ,
        "GENHOOK_DATABASE_URL": settings.resolved_database_url,
        "GENHOOK_DATA_DIR": str(settings.data_dir),
        "GENHOOK_WEBHOOK_ALLOW_PRIVATE_TARGETS": "true",
        "GENHOOK_WEBHOOK_TIMEOUT_SECONDS": "1.0",
        "PYTHONPATH": str(ROOT),
    }
    sender = subprocess.Popen([sys.executable, "-c", SENDER], env=env_vars)
    try:
        await receiver.wait_for(1, timeout=60)
        os.kill(sender.pid, signal.SIGKILL)
        sender.wait(10)
        async with db.read() as session:
            row = await session.get(WebhookDelivery, delivery_id)
            assert row is not None and row.status == "pending" and row.lease_owner is not None
        service = webhook_service(settings, db, lease_margin_seconds=0.5)
        await run_until(service, wait_status(db, delivery_id, "delivered"))
        first, second = receiver.received
        assert first.headers["X-Service-Webhook-Id"] == "t_killed"
        assert second.headers["X-Service-Webhook-Id"] == "t_killed"
        assert first.body == second.body
        assert json.loads(second.body)["session_id"] == "t_killed"
    finally:
        release.set()
        if sender.poll() is None:
            sender.kill()
        await receiver.stop()


async def test_reconciler_enqueues_missing_and_clears_expired(
    env: tuple[Settings, Database],
) -> None:
    settings, db = env
    receiver = await Receiver(status(200)).start()
    try:
        url = f"http://127.0.0.1:{receiver.port}/"
        orphan = terminal_task(
            "t_orphan",
            url,
            status="timeout",
            error_code=4002,
            error_message="engine-specific detail",
        )
        no_hook = terminal_task("t_nohook", None)
        stuck = terminal_task("t_stuck", url)
        old = now_ms() - 5_000
        async with db.write() as session:
            session.add_all([orphan, no_hook, stuck])
            await session.flush()
            await session.execute(
                insert(WebhookDelivery).values(
                    id="whd_stuck",
                    task_id="t_stuck",
                    account_id="acct_1",
                    url=url,
                    event_type="image.task.terminal",
                    body=b'{"session_id":"t_stuck"}',
                    status="pending",
                    attempts=0,
                    round_start=0,
                    redeliveries=0,
                    next_attempt_at=old,
                    lease_owner="dead-process",
                    lease_expires_at=old,
                    created_at=old,
                    updated_at=old,
                )
            )
        reconciler = wired_reconciler(settings, db)
        report = await reconciler.run_once()
        assert (report.enqueued, report.expired_leases) == (1, 1)
        again = await reconciler.run_once()
        assert (again.enqueued, again.expired_leases) == (0, 0)
        async with db.read() as session:
            [row] = (
                await session.scalars(
                    select(WebhookDelivery).where(WebhookDelivery.task_id == "t_orphan")
                )
            ).all()
        body = json.loads(row.body)
        assert body["status"] == "ERROR" and body["payload"]["status"] == "timeout"
        assert body["error"] == "The task did not finish before its deadline."
        assert body["payload"]["error_code"] == 4002
        service = webhook_service(settings, db)
        await run_until(service, wait_status(db, row.id, "delivered"))
        await wait_status(db, "whd_stuck", "delivered")
        ids = sorted(r.headers["X-Service-Webhook-Id"] for r in receiver.received)
        assert ids == ["t_orphan", "t_stuck"]
    finally:
        await receiver.stop()


async def test_graceful_stop_releases_nothing_in_flight(env: tuple[Settings, Database]) -> None:
    """Stopping while an attempt is in flight lets it finish and records it."""
    settings, db = env
    gate = asyncio.Event()

    async def slow(_: web.Request, __: int) -> web.StreamResponse:
        gate.set()
        await asyncio.sleep(0.2)
        return web.Response(status=200)

    receiver = await Receiver(slow).start()
    try:
        delivery_id = await enqueue(
            db, terminal_task("t_graceful", f"http://127.0.0.1:{receiver.port}/")
        )
        stop = asyncio.Event()
        run = asyncio.create_task(webhook_service(settings, db).run(stop))
        await asyncio.wait_for(gate.wait(), 20)
        stop.set()
        await run
        async with db.read() as session:
            row = await session.get(WebhookDelivery, delivery_id)
            assert row is not None and row.status == "delivered" and row.lease_owner is None
            log = (await session.scalars(select(WebhookAttempt))).all()
            assert [a.number for a in log] == [1]
    finally:
        await receiver.stop()


async def test_due_and_missing_queries_use_indexes(env: tuple[Settings, Database]) -> None:
    """Reconciliation and claims follow the number of due rows: they run on indexes."""
    settings, db = env
    if not db.is_sqlite:
        pytest.skip("EXPLAIN QUERY PLAN is SQLite's")
    dispatcher = Dispatcher(
        settings, db, policy=webhook_service(settings, db).policy, keyring=KeyRing(db, settings)
    )
    assert (await dispatcher.feed.exchange((), 10)).claimed == []
    await dispatcher.feed.close()
    params = {
        "outcomes": "[]",
        "owner": "o",
        "now": 1,
        "expires": 2,
        "limit": 10,
        "scan": 40,
        "destination_rooms": '{"https://a.example:443": 0}',
        "account_rooms": "{}",
        "destination_default": 16,
        "account_default": 128,
        "returned": "[]",
    }
    async with db.read() as session:
        # The delivery queue's own statements: due rows through the (status, time) index,
        # everything else by primary key, never a walk over all pending rows.
        for statement in (queue_sqlite.CLAIM, queue_sqlite.CLAIMED):
            plan = " ".join(
                str(r)
                for r in await session.execute(text("EXPLAIN QUERY PLAN " + statement), params)
            )
            assert "ix_deliveries_status_next" in plan, plan
            assert "SCAN webhook_deliveries" not in plan, plan
        for statement in (queue_sqlite.ATTEMPTS, queue_sqlite.STATES, queue_sqlite.RETURN):
            plan = " ".join(
                str(r)
                for r in await session.execute(text("EXPLAIN QUERY PLAN " + statement), params)
            )
            assert "sqlite_autoindex_webhook_deliveries_1 (id=?)" in plan, plan
            assert "status=" not in plan and "SCAN webhook_deliveries" not in plan, plan
        plan = (
            await session.execute(
                text(
                    "EXPLAIN QUERY PLAN SELECT tasks.id FROM tasks LEFT OUTER JOIN "
                    "webhook_deliveries ON webhook_deliveries.task_id = tasks.id WHERE "
                    "tasks.finished_at >= 1 AND "
                    "tasks.finished_at <= 2 AND tasks.webhook_url IS NOT NULL AND "
                    "webhook_deliveries.id IS NULL"
                )
            )
        ).all()
        assert "ix_tasks_finished" in " ".join(str(r) for r in plan)
