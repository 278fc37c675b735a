"""Signing keys on a real database: first start, concurrency, rotation overlap, retirement,
encryption at rest, and the CLI commands."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from genhook.config import Settings
from genhook.db import Account, Database, SigningKey
from genhook.errors import Conflict
from genhook.sender.keys import (
    DAY_MS,
    KEY_FILE_NAME,
    SigningKeyError,
    ensure_signing_key,
    jwks,
    list_signing_keys,
    load_encryption_key,
    retire_expired_keys,
    retire_signing_key,
    rotate_signing_key,
)
from genhook.sender.secret_box import is_sealed, open_secret
from tests.support.webhook_receiver import add_account, create_schema, webhook_settings


@pytest.fixture
async def env(tmp_path: Path, database_url: str) -> AsyncIterator[tuple[Settings, Database]]:
    settings = webhook_settings(tmp_path, database_url)
    db = Database(database_url)
    await create_schema(db)
    yield settings, db
    await db.dispose()


async def test_concurrent_first_start_creates_one_key(env: tuple[Settings, Database]) -> None:
    settings, db = env
    handles = [Database(settings.resolved_database_url) for _ in range(5)]
    try:
        await asyncio.gather(*(ensure_signing_key(h, settings) for h in handles))
        await ensure_signing_key(db, settings)
    finally:
        for h in handles:
            await h.dispose()
    keys = await list_signing_keys(db)
    assert [k.status for k in keys] == ["active"]
    key_file = Path(settings.data_dir) / KEY_FILE_NAME
    assert key_file.stat().st_mode & 0o777 == 0o600


async def test_rotation_overlap_and_retirement(env: tuple[Settings, Database]) -> None:
    settings, db = env
    await ensure_signing_key(db, settings)
    [first] = await list_signing_keys(db)
    t0 = 1_800_000_000_000
    second = await rotate_signing_key(db, settings, now=t0)
    published = {k["kid"] for k in (await jwks(db, now=t0 + 1))["keys"]}
    assert published == {first.kid, second}
    # Still published inside the 7-day overlap, gone after it.
    assert len((await jwks(db, now=t0 + 7 * DAY_MS - 1))["keys"]) == 2
    assert [k["kid"] for k in (await jwks(db, now=t0 + 7 * DAY_MS))["keys"]] == [second]
    assert await retire_expired_keys(db, now=t0 + 7 * DAY_MS) == 1
    third = await rotate_signing_key(db, settings, now=t0 + 1000)
    with pytest.raises(Conflict):
        await retire_signing_key(db, third)
    await retire_signing_key(db, second, now=t0 + 2000)
    assert [k["kid"] for k in (await jwks(db, now=t0 + 3000))["keys"]] == [third]
    statuses = {k.kid: k.status for k in await list_signing_keys(db)}
    assert statuses == {first.kid: "retired", second: "retired", third: "active"}


async def test_private_keys_are_encrypted_at_rest(env: tuple[Settings, Database]) -> None:
    settings, db = env
    await ensure_signing_key(db, settings)
    async with db.read() as session:
        row = (await session.scalars(select(SigningKey))).one()
    assert row.private_key_encrypted[:1] == b"\x01" and len(row.private_key_encrypted) == 61
    other = settings.model_copy(update={"webhook_encryption_key": "A" * 43})
    with pytest.raises(SigningKeyError):
        await ensure_signing_key(db, other)
    bad = settings.model_copy(update={"webhook_encryption_key": "short"})
    with pytest.raises(SigningKeyError):
        await ensure_signing_key(db, bad)


async def test_cli_commands(
    env: tuple[Settings, Database], monkeypatch: pytest.MonkeyPatch
) -> None:
    from genhook.cli.webhooks import deliveries_app, rotate_secret, signing_keys_app

    settings, db = env
    await add_account(db, "acct_cli", "whsec_old")
    monkeypatch.setenv("GENHOOK_DATABASE_URL", settings.resolved_database_url)
    monkeypatch.setenv("GENHOOK_DATA_DIR", str(settings.data_dir))
    runner = CliRunner()

    def invoke() -> None:
        rotated = runner.invoke(signing_keys_app, ["rotate"])
        assert rotated.exit_code == 0, rotated.output
        listed = runner.invoke(signing_keys_app, ["list", "--json"])
        assert listed.exit_code == 0, listed.output
        rows = json.loads(listed.output)
        assert sorted(r["status"] for r in rows) == ["active", "rotated"]
        rotated_kid = next(r["kid"] for r in rows if r["status"] == "rotated")
        retired = runner.invoke(signing_keys_app, ["retire", rotated_kid])
        assert retired.exit_code == 0, retired.output
        missing = runner.invoke(signing_keys_app, ["retire", "key_nope"])
        assert missing.exit_code == 1
        deliveries = runner.invoke(deliveries_app, ["list", "--json"])
        assert deliveries.exit_code == 0 and json.loads(deliveries.output)["data"] == []
        gone = runner.invoke(deliveries_app, ["redeliver", "whd_nope"])
        assert gone.exit_code == 1

        import typer

        app = typer.Typer()
        app.command()(rotate_secret)
        secret = runner.invoke(app, ["acct_cli"])
        assert secret.exit_code == 0, secret.output
        assert "whsec_" in secret.output

    await asyncio.to_thread(invoke)
    async with db.read() as session:
        account = await session.get(Account, "acct_cli")
        assert account is not None and is_sealed(account.signing_secret)
        secret = open_secret(account.signing_secret, "acct_cli", load_encryption_key(settings))
        assert secret.startswith("whsec_") and secret != "whsec_old"


async def test_jwks_cache_lifetime_ends_when_a_rotated_key_retires(
    env: tuple[Settings, Database],
) -> None:
    from genhook.db import now_ms
    from genhook.sender.keys import JWKS_MAX_AGE_SECONDS, jwks_max_age

    settings, db = env
    await ensure_signing_key(db, settings)
    now = now_ms()
    assert await jwks_max_age(db, now=now) == JWKS_MAX_AGE_SECONDS
    overlap_ms = int(settings.webhook_key_overlap_days * DAY_MS)
    # Rotated long enough ago that its overlap ends in 100 s: caches must not outlive it.
    await rotate_signing_key(db, settings, now=now - overlap_ms + 100_000)
    assert await jwks_max_age(db, now=now) == 100
    assert len((await jwks(db, now=now))["keys"]) == 2
    assert await jwks_max_age(db, now=now + 100_000) == JWKS_MAX_AGE_SECONDS
    assert len((await jwks(db, now=now + 100_000))["keys"]) == 1
