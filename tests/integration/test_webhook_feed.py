"""The attempt feed: claim, sign and record in one exchange."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nacl.signing import VerifyKey
from sqlalchemy import select

from genhook.config import Settings
from genhook.db import Database, WebhookAttempt, WebhookDelivery, now_ms
from genhook.sender.feed import LocalFeed
from genhook.sender.keys import KeyRing, ensure_signing_key, jwks
from genhook.sender.queue import Outcome, Outgoing
from genhook.signature import b64url_decode
from tests.integration.test_webhook_queue import ODD_BODY, add_deliveries
from tests.support.webhook_receiver import add_account, create_schema, webhook_settings

LEASE_MS = 40_000


@pytest.fixture
async def env(tmp_path: Path, database_url: str) -> AsyncIterator[tuple[Settings, Database]]:
    settings = webhook_settings(tmp_path, database_url)
    db = Database(database_url)
    await create_schema(db)
    await add_account(db, "acct_1", "whsec_one")
    await add_account(db, "acct_2", "whsec_two")
    await ensure_signing_key(db, settings)
    yield settings, db
    await db.dispose()


def make_feed(settings: Settings, db: Database, owner: str = "owner-a") -> LocalFeed:
    return LocalFeed(settings, db, KeyRing(db, settings), owner=owner, lease_ms=LEASE_MS)


def acknowledged(attempt: Outgoing, status_code: int = 200) -> Outcome:
    error = None if 200 <= status_code < 300 else f"HTTP {status_code}"
    return Outcome(
        attempt.id, attempt.attempts, attempt.round_start, now_ms(), 4, status_code, error,
        "ok", attempt.kid, None,
    )  # fmt: skip


async def test_claims_signs_and_records(env: tuple[Settings, Database]) -> None:
    settings, db = env
    ids = await add_deliveries(db, 5)
    keys = {k["kid"]: k for k in (await jwks(db))["keys"]}
    feed = make_feed(settings, db)
    try:
        await feed.start()
        # Oldest due first; within a batch the order is the database's.
        attempts = sorted((await feed.exchange([], 3)).claimed, key=lambda a: a.id)
        assert [a.id for a in attempts] == ids[:3]
        for i, attempt in enumerate(attempts):
            assert attempt.body == ODD_BODY + str(i).encode()  # byte for byte
            headers = attempt.headers
            stamp = headers["X-Service-Webhook-Timestamp"]
            public = b64url_decode(keys[attempt.kid]["x"])
            signature = b64url_decode(headers["X-Service-Webhook-Signature-Ed25519"])
            VerifyKey(public).verify(stamp.encode() + b"." + attempt.body, signature)
            secret = b"whsec_one" if i % 2 == 0 else b"whsec_two"
            digest = hmac.new(secret, attempt.body, hashlib.sha256).hexdigest()
            assert headers["X-Service-Webhook-Signature"] == digest
            assert headers["X-Service-Webhook-Id"] == attempt.task_id
        # The outcomes are recorded in the same exchange that claims the rest.
        rest = (
            await feed.exchange([acknowledged(attempts[0]), acknowledged(attempts[1], 500)], 10)
        ).claimed
        assert sorted(a.id for a in rest) == ids[3:]
        last = [acknowledged(a) for a in [attempts[2], *rest]]
        assert (await feed.exchange(last, 0)).claimed == []
    finally:
        await feed.close()
    async with db.read() as session:
        rows = {r.id: r for r in await session.scalars(select(WebhookDelivery))}
        log = (await session.scalars(select(WebhookAttempt))).all()
    assert rows[ids[0]].status == "delivered"
    assert rows[ids[1]].status == "pending" and rows[ids[1]].attempts == 1
    assert rows[ids[1]].lease_owner is None and rows[ids[1]].last_error == "HTTP 500"
    assert sorted(a.delivery_id for a in log) == sorted(ids)
