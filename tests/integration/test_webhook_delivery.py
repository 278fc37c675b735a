"""Delivery end to end against real receivers on loopback: signatures, retries, refusals."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from nacl.signing import VerifyKey
from sqlalchemy import select

from genhook.config import Settings
from genhook.db import Database, WebhookAttempt, WebhookDelivery
from genhook.net import AddressPolicy
from genhook.sender.keys import ensure_signing_key, jwks, rotate_signing_key
from genhook.sender.service import WebhookService
from genhook.signature import b64url_decode
from genhook.wiring import webhook_service
from tests.support.webhook_receiver import (
    PATIENT_TIMEOUT_SECONDS,
    MapResolver,
    Receiver,
    add_account,
    create_schema,
    enqueue,
    loopback_only,
    make_tls,
    sequence,
    status,
    terminal_task,
    webhook_settings,
)

__all__ = ["loopback_only"]

SECRET = "whsec_test"


@pytest.fixture
async def env(tmp_path: Path, database_url: str) -> AsyncIterator[tuple[Settings, Database]]:
    settings = webhook_settings(
        tmp_path, database_url, webhook_timeout_seconds=PATIENT_TIMEOUT_SECONDS
    )
    db = Database(database_url)
    await create_schema(db)
    await add_account(db, secret=SECRET)
    yield settings, db
    await db.dispose()


class Running:
    def __init__(self, service: WebhookService) -> None:
        self.service = service
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> WebhookService:
        self.task = asyncio.create_task(self.service.run(self.stop))
        return self.service

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        assert self.task is not None
        await self.task


async def delivery(db: Database, delivery_id: str) -> WebhookDelivery:
    async with db.read() as session:
        row = await session.get(WebhookDelivery, delivery_id)
        assert row is not None
        return row


async def attempts(db: Database, delivery_id: str) -> list[WebhookAttempt]:
    async with db.read() as session:
        rows = await session.scalars(
            select(WebhookAttempt)
            .where(WebhookAttempt.delivery_id == delivery_id)
            .order_by(WebhookAttempt.number)
        )
        return list(rows.all())


async def settle(db: Database, delivery_id: str, timeout: float = 20.0) -> WebhookDelivery:
    async with asyncio.timeout(timeout):
        while True:
            row = await delivery(db, delivery_id)
            if row.status != "pending":
                return row
            await asyncio.sleep(0.02)


def verify_ed25519(keys: dict[str, Any], headers: dict[str, str], body: bytes, header: str) -> str:
    """Independent check with PyNaCl over the exact bytes received."""
    kid = headers["X-Service-Webhook-Key-Id"]
    jwk = next(k for k in keys["keys"] if k["kid"] == kid)
    assert (jwk["kty"], jwk["crv"], jwk["use"], jwk["alg"]) == ("OKP", "Ed25519", "sig", "EdDSA")
    public = b64url_decode(jwk["x"])
    assert len(public) == 32
    message = headers["X-Service-Webhook-Timestamp"].encode() + b"." + body
    VerifyKey(public).verify(message, b64url_decode(headers[header]))
    return kid


async def test_signed_delivery_migration_mode(env: tuple[Settings, Database]) -> None:
    settings, db = env
    receiver = await Receiver(status(204)).start()
    try:
        task = terminal_task("task_ok", f"http://127.0.0.1:{receiver.port}/hook")
        delivery_id = await enqueue(db, task)
        async with Running(webhook_service(settings, db)):
            row = await settle(db, delivery_id)
        assert row.status == "delivered"
        [got] = receiver.received
        stored = (await delivery(db, delivery_id)).body
        assert got.body == stored
        body = json.loads(got.body)
        assert body["session_id"] == "task_ok"
        assert body["event_type"] == "image.task.terminal"
        assert body["status"] == "OK"
        assert body["created_at"] == 1_700_000_000_123
        assert body["payload"]["status"] == "completed"
        assert body["payload"]["outputs"]
        assert "error" not in body
        h = got.headers
        # The contract's headers and what HTTP/1.1 needs, nothing else (no Accept-Encoding:
        # the excerpt of the answer is stored as received).
        assert {name.lower() for name in h} == {
            "host",
            "content-length",
            "content-type",
            "user-agent",
            *(f"x-service-webhook-{n}" for n in ("id", "event", "timestamp", "key-id")),
            "x-service-webhook-signature",
            "x-service-webhook-signature-ed25519",
        }
        assert h["Content-Type"] == "application/json"
        assert h["User-Agent"] == "Service-Webhook/1.0"
        assert h["X-Service-Webhook-Id"] == "task_ok"
        assert h["X-Service-Webhook-Event"] == "image.task.terminal"
        assert abs(int(h["X-Service-Webhook-Timestamp"]) - time.time()) < 300
        expected = hmac.new(SECRET.encode(), got.body, hashlib.sha256).hexdigest()
        assert h["X-Service-Webhook-Signature"] == expected
        keys = await jwks(db)
        kid = verify_ed25519(keys, h, got.body, "X-Service-Webhook-Signature-Ed25519")
        [attempt] = await attempts(db, delivery_id)
        assert (attempt.number, attempt.status_code, attempt.error, attempt.kid) == (
            1,
            204,
            None,
            kid,
        )
    finally:
        await receiver.stop()


async def test_ed25519_mode_over_https(env: tuple[Settings, Database], tmp_path: Path) -> None:
    settings, db = env
    tls = make_tls(tmp_path, "hooks.test")
    settings = settings.model_copy(
        update={
            "webhook_signing": "ed25519",
            "webhook_ca_file": tls.ca_file,
            "webhook_header_brand": "Acme",
        }
    )
    receiver = await Receiver(status(200)).start(tls.server)
    resolver = MapResolver({"hooks.test": ["127.0.0.1"], "wrong.test": ["127.0.0.1"]})
    try:
        ok = await enqueue(
            db,
            terminal_task(
                "task_tls",
                f"https://hooks.test:{receiver.port}/cb",
                status="failed",
                error_code=2001,
                error_message="The prompt contains a blocked term.",
            ),
        )
        bad = await enqueue(
            db, terminal_task("task_badname", f"https://wrong.test:{receiver.port}/")
        )
        async with Running(webhook_service(settings, db, resolver=resolver)):
            assert (await settle(db, ok)).status == "delivered"
            await receiver.wait_for(1)
            while not await attempts(db, bad):
                await asyncio.sleep(0.02)
        [got] = receiver.received
        body = json.loads(got.body)
        assert body["status"] == "ERROR"
        assert body["error"] == "The prompt contains a blocked term."
        assert body["payload"]["status"] == "failed"
        assert body["payload"]["error_code"] == 2001
        h = got.headers
        assert h["User-Agent"] == "Acme-Webhook/1.0"
        assert h["X-Acme-Webhook-Signature"] == h["X-Acme-Webhook-Signature-Ed25519"]
        keys = await jwks(db)
        h2 = {k.replace("Acme", "Service"): v for k, v in h.items()}
        verify_ed25519(keys, h2, got.body, "X-Service-Webhook-Signature")
        first = (await attempts(db, bad))[0]
        assert first.status_code is None and first.error is not None
        assert "certificate" in first.error.lower() or "tls" in first.error.lower()
    finally:
        await receiver.stop()


async def test_retries_then_success_and_attempt_log(env: tuple[Settings, Database]) -> None:
    settings, db = env
    receiver = await Receiver(sequence(500, 502, 200)).start()
    try:
        delivery_id = await enqueue(
            db, terminal_task("task_retry", f"http://127.0.0.1:{receiver.port}/")
        )
        async with Running(webhook_service(settings, db)):
            row = await settle(db, delivery_id)
        assert row.status == "delivered" and row.attempts == 3
        log = await attempts(db, delivery_id)
        assert [(a.number, a.status_code) for a in log] == [(1, 500), (2, 502), (3, 200)]
        assert log[0].error == "HTTP 500" and log[0].response_excerpt == "answer 500"
        assert len({r.body for r in receiver.received}) == 1
        stamps = [r.headers["X-Service-Webhook-Signature-Ed25519"] for r in receiver.received]
        assert len(stamps) == 3
    finally:
        await receiver.stop()


async def test_gone_stops_and_max_attempts_give_up(env: tuple[Settings, Database]) -> None:
    settings, db = env
    settings = settings.model_copy(update={"webhook_retry_max_attempts": 3})
    gone = await Receiver(status(410)).start()
    failing = await Receiver(status(500)).start()
    try:
        a = await enqueue(db, terminal_task("task_gone", f"http://127.0.0.1:{gone.port}/"))
        b = await enqueue(db, terminal_task("task_fail", f"http://127.0.0.1:{failing.port}/"))
        async with Running(webhook_service(settings, db)):
            assert (await settle(db, a)).status == "undeliverable"
            assert (await settle(db, b)).status == "undeliverable"
        assert len(gone.received) == 1
        assert len(failing.received) == 3
        assert [x.number for x in await attempts(db, b)] == [1, 2, 3]
    finally:
        await gone.stop()
        await failing.stop()


async def test_retry_after_is_honoured(env: tuple[Settings, Database]) -> None:
    settings, db = env
    receiver = await Receiver(status(429, **{"Retry-After": "120"})).start()
    try:
        delivery_id = await enqueue(
            db, terminal_task("task_429", f"http://127.0.0.1:{receiver.port}/")
        )
        async with Running(webhook_service(settings, db)):
            await receiver.wait_for(1)
            while (row := await delivery(db, delivery_id)).attempts < 1:
                await asyncio.sleep(0.02)
        assert row.status == "pending"
        assert row.next_attempt_at is not None and row.last_attempt_at is not None
        # Capped at the retry cap (0.2 s here), and at least the 1 s floor: the cap wins.
        assert row.next_attempt_at - row.last_attempt_at >= 150
        settings2 = settings.model_copy(update={"webhook_retry_cap_seconds": 3600.0})
        async with db.write() as session:
            r = await session.get(WebhookDelivery, delivery_id)
            assert r is not None
            r.next_attempt_at = 0
        async with Running(webhook_service(settings2, db)):
            await receiver.wait_for(2)
            while (row := await delivery(db, delivery_id)).attempts < 2:
                await asyncio.sleep(0.02)
        assert row.next_attempt_at is not None and row.last_attempt_at is not None
        assert row.next_attempt_at - row.last_attempt_at >= 119_000
    finally:
        await receiver.stop()


async def test_timeout_redirect_and_refused_connection(env: tuple[Settings, Database]) -> None:
    settings, db = env
    # Long enough for the redirect's answer on a busy machine; the hang still times out.
    settings = settings.model_copy(
        update={"webhook_timeout_seconds": 2.0, "webhook_retry_max_attempts": 1}
    )
    release = asyncio.Event()

    async def hang(_: web.Request, __: int) -> web.StreamResponse:
        await release.wait()
        return web.Response()

    async def redirect(_: web.Request, __: int) -> web.StreamResponse:
        return web.Response(status=302, headers={"Location": f"http://127.0.0.1:{ok.port}/"})

    slow = await Receiver(hang).start()
    mover = await Receiver(redirect).start()
    ok = await Receiver(status(200)).start()
    closed = await Receiver(status(200)).start()
    await closed.stop()
    try:
        a = await enqueue(db, terminal_task("t_hang", f"http://127.0.0.1:{slow.port}/"))
        b = await enqueue(db, terminal_task("t_redirect", f"http://127.0.0.1:{mover.port}/"))
        c = await enqueue(db, terminal_task("t_closed", f"http://127.0.0.1:{closed.port}/"))
        async with Running(webhook_service(settings, db)):
            rows = [await settle(db, x) for x in (a, b, c)]
        release.set()
        assert [r.status for r in rows] == ["undeliverable"] * 3
        assert (await attempts(db, a))[0].error == "timeout after 2 s"
        assert (await attempts(db, b))[0].status_code == 302
        assert "redirect not followed" in str((await attempts(db, b))[0].error)
        assert ok.received == []
        assert str((await attempts(db, c))[0].error).startswith("connection failed")
    finally:
        release.set()
        for r in (slow, mover, ok):
            await r.stop()


async def test_dns_rebinding_refused_at_delivery(
    env: tuple[Settings, Database], loopback_only: list[object]
) -> None:
    settings, db = env
    settings = settings.model_copy(
        update={"webhook_allow_private_targets": False, "webhook_retry_max_attempts": 2}
    )
    receiver = await Receiver(status(200)).start()
    resolver = MapResolver({"rebind.test": ["93.184.216.34"]})
    policy = AddressPolicy(resolver=resolver)
    url = f"https://rebind.test:{receiver.port}/"
    try:
        await policy.check_webhook_url(url)  # public at submit time
        resolver.table["rebind.test"] = ["127.0.0.1"]  # private at delivery time
        delivery_id = await enqueue(db, terminal_task("t_rebind", url))
        async with Running(webhook_service(settings, db, policy=policy)):
            row = await settle(db, delivery_id)
        assert row.status == "undeliverable"
        log = await attempts(db, delivery_id)
        assert all(a.error and a.error.startswith("target refused") for a in log)
        assert receiver.received == []
        assert loopback_only == []
    finally:
        await receiver.stop()


async def test_key_rotation_while_deliveries_pending(env: tuple[Settings, Database]) -> None:
    """A rotation made elsewhere (the CLI) reaches the signer within its key ring's refresh
    window (2 s): the retry, 3 s later by Retry-After, is signed with the new key."""
    settings, db = env
    settings = settings.model_copy(update={"webhook_retry_cap_seconds": 5.0})

    async def answer(_: web.Request, n: int) -> web.StreamResponse:
        if n == 1:
            return web.Response(status=429, headers={"Retry-After": "3"})
        return web.Response(status=200)

    receiver = await Receiver(answer).start()
    try:
        await ensure_signing_key(db, settings)
        before = await jwks(db)
        delivery_id = await enqueue(
            db, terminal_task("t_rot", f"http://127.0.0.1:{receiver.port}/")
        )
        async with Running(webhook_service(settings, db)):
            await receiver.wait_for(1)
            new_kid = await rotate_signing_key(db, settings)
            row = await settle(db, delivery_id)
        assert row.status == "delivered"
        old_kid = before["keys"][0]["kid"]
        after = await jwks(db)
        assert {k["kid"] for k in after["keys"]} == {old_kid, new_kid}
        first, second = receiver.received
        assert (
            verify_ed25519(after, first.headers, first.body, "X-Service-Webhook-Signature-Ed25519")
            == old_kid
        )
        assert (
            verify_ed25519(
                after, second.headers, second.body, "X-Service-Webhook-Signature-Ed25519"
            )
            == new_kid
        )
    finally:
        await receiver.stop()


async def test_two_services_deliver_each_exactly_once(env: tuple[Settings, Database]) -> None:
    settings, db = env
    receiver = await Receiver(status(200)).start()
    try:
        ids = [
            await enqueue(db, terminal_task(f"t_many_{i}", f"http://127.0.0.1:{receiver.port}/"))
            for i in range(120)
        ]
        async with (
            Running(webhook_service(settings, db, owner="a")),
            Running(webhook_service(settings, db, owner="b")),
        ):
            await receiver.wait_for(120)
            for delivery_id in ids:
                await settle(db, delivery_id)
        sessions = [r.headers["X-Service-Webhook-Id"] for r in receiver.received]
        assert sorted(sessions) == sorted(f"t_many_{i}" for i in range(120))
    finally:
        await receiver.stop()


async def test_binary_answers_are_logged_safely(env: tuple[Settings, Database]) -> None:
    settings, db = env

    async def binary(_: web.Request, n: int) -> web.StreamResponse:
        return web.Response(status=500 if n == 1 else 200, body=b"\x00\xff\xfebin" * 500)

    receiver = await Receiver(binary).start()
    try:
        delivery_id = await enqueue(
            db, terminal_task("t_bin", f"http://127.0.0.1:{receiver.port}/")
        )
        async with Running(webhook_service(settings, db)):
            row = await settle(db, delivery_id)
        assert row.status == "delivered"
        first = (await attempts(db, delivery_id))[0]
        assert first.status_code == 500 and first.response_excerpt is not None
        assert "\x00" not in first.response_excerpt
        assert (
            len(first.response_excerpt.encode("utf-8"))
            <= 3 * settings.webhook_response_excerpt_bytes
        )
    finally:
        await receiver.stop()


def count_next_due_reads(monkeypatch: pytest.MonkeyPatch, receiver: Receiver) -> list[int]:
    """The dispatcher's separate reads of the next due time, each as the number of requests
    the receiver had when it began."""
    from genhook.sender import dispatcher as dispatcher_module

    reads: list[int] = []
    earliest = dispatcher_module.earliest_pending

    async def counted(database: Database) -> int | None:
        reads.append(len(receiver.received))
        return await earliest(database)

    monkeypatch.setattr(dispatcher_module, "earliest_pending", counted)
    return reads


async def test_the_next_due_read_waits_for_the_attempt_in_flight(
    env: tuple[Settings, Database], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The safety poll's read of the next due time (here every 10 ms) waits for an attempt
    in flight: run on the loop at once, it would hold back the request just claimed."""
    settings, db = env
    receiver = await Receiver(status(204)).start()
    reads = count_next_due_reads(monkeypatch, receiver)
    try:
        task = terminal_task("task_read", f"http://127.0.0.1:{receiver.port}/hook")
        delivery_id = await enqueue(db, task)
        async with Running(webhook_service(settings, db)):
            assert (await settle(db, delivery_id)).status == "delivered"
            async with asyncio.timeout(10):
                while not reads:
                    await asyncio.sleep(0.01)
        assert reads[0] == 1
    finally:
        await receiver.stop()


async def test_a_retry_falls_due_without_a_read_of_its_own(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exchange that records a failed attempt also tells when its retry falls due, so
    the retry goes out on time with no read transaction of its own and no poll (an hour)."""
    settings = webhook_settings(
        tmp_path,
        database_url,
        webhook_timeout_seconds=PATIENT_TIMEOUT_SECONDS,
        webhook_poll_seconds=3600.0,
    )
    db = Database(database_url)
    await create_schema(db)
    await add_account(db, secret=SECRET)
    receiver = await Receiver(sequence(500, 204)).start()
    reads = count_next_due_reads(monkeypatch, receiver)
    try:
        task = terminal_task("task_retry", f"http://127.0.0.1:{receiver.port}/hook")
        delivery_id = await enqueue(db, task)
        async with Running(webhook_service(settings, db)):
            row = await settle(db, delivery_id, timeout=10.0)
        assert row.status == "delivered"
        assert [a.status_code for a in await attempts(db, delivery_id)] == [500, 204]
        assert reads == []
    finally:
        await receiver.stop()
        await db.dispose()
