"""Standard Webhooks mode end to end: per-account opt-in over a real delivery, headers that
the specification's library accepts, and a ``webhook-id`` stable across retries."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nacl.signing import VerifyKey
from sqlalchemy import update
from standardwebhooks import Webhook

from genhook.client import standard_secret
from genhook.config import Settings
from genhook.db import Account, Database, WebhookDelivery
from genhook.sender.keys import ensure_signing_key, jwks
from genhook.signature import b64url_decode, hmac_hex
from genhook.wiring import webhook_service
from tests.support.webhook_receiver import (
    Receiver,
    add_account,
    create_schema,
    enqueue,
    sequence,
    status,
    terminal_task,
    webhook_settings,
)

SECRET = "whsec_" + base64.urlsafe_b64encode(bytes(range(32))).decode().rstrip("=")


@pytest.fixture
async def env(tmp_path: Path, database_url: str) -> AsyncIterator[tuple[Settings, Database]]:
    settings = webhook_settings(tmp_path, database_url)
    db = Database(database_url)
    await create_schema(db)
    await add_account(db, "acct_1", secret=SECRET)
    await add_account(db, "acct_2", secret=SECRET)
    async with db.write() as session:
        await session.execute(
            update(Account).where(Account.id == "acct_1").values(standard_webhooks=True)
        )
    await ensure_signing_key(db, settings)
    yield settings, db
    await db.dispose()


async def settle(db: Database, ids: list[str]) -> None:
    async with asyncio.timeout(20):
        while True:
            async with db.read() as session:
                rows = [await session.get(WebhookDelivery, i) for i in ids]
            if all(r is not None and r.status != "pending" for r in rows):
                return
            await asyncio.sleep(0.02)


async def test_per_account_standard_headers_stable_across_retries(
    env: tuple[Settings, Database],
) -> None:
    settings, db = env
    opted = await Receiver(sequence(500, 204)).start()
    plain = await Receiver(status(204)).start()
    stop = asyncio.Event()
    try:
        a = await enqueue(db, terminal_task("t_std", f"http://127.0.0.1:{opted.port}/"))
        b = await enqueue(
            db, terminal_task("t_plain", f"http://127.0.0.1:{plain.port}/", account_id="acct_2")
        )
        run = asyncio.create_task(webhook_service(settings, db).run(stop))
        await settle(db, [a, b])
        stop.set()
        await run
        first, second = opted.received
        assert first.headers["webhook-id"] == second.headers["webhook-id"] == a
        keys = {k["kid"]: k for k in (await jwks(db))["keys"]}
        for got in (first, second):
            h = got.headers
            # The contract's headers are unchanged.
            assert h["X-Service-Webhook-Id"] == "t_std"
            assert h["X-Service-Webhook-Signature"] == hmac_hex(SECRET, got.body)
            assert h["webhook-timestamp"] == h["X-Service-Webhook-Timestamp"]
            # v1 with the reference library, v1a independently with PyNaCl.
            assert Webhook(standard_secret(SECRET)).verify(got.body, h)["session_id"] == "t_std"
            [v1a] = [s[4:] for s in h["webhook-signature"].split() if s.startswith("v1a,")]
            public = VerifyKey(b64url_decode(keys[h["X-Service-Webhook-Key-Id"]]["x"]))
            message = f"{a}.{h['webhook-timestamp']}.".encode() + got.body
            public.verify(message, base64.b64decode(v1a))
        [other] = plain.received
        assert not any(k.lower().startswith("webhook-") for k in other.headers)
    finally:
        stop.set()
        await opted.stop()
        await plain.stop()
