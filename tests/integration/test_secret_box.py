"""Accounts' HMAC signing secrets encrypted at rest, and the sealing of rows older versions
stored in clear; on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import select

from genhook.accounts import create_account
from genhook.config import Settings
from genhook.db import Account, Database
from genhook.sender.keys import SigningKeyError, load_encryption_key, new_encryption_key
from genhook.sender.secret_box import (
    SecretOpener,
    is_sealed,
    open_secret,
    seal_plaintext_secrets,
    seal_secret,
)
from tests.support.webhook_receiver import add_account, create_schema, webhook_settings


@pytest.fixture
async def env(tmp_path: Path, database_url: str) -> AsyncIterator[tuple[Settings, Database]]:
    settings = webhook_settings(tmp_path, database_url)
    db = Database(database_url)
    await create_schema(db)
    yield settings, db
    await db.dispose()


async def stored_secret(db: Database, account_id: str) -> str:
    async with db.read() as session:
        row = await session.get(Account, account_id)
    assert row is not None
    return row.signing_secret


async def test_new_accounts_store_the_secret_sealed(env: tuple[Settings, Database]) -> None:
    settings, db = env
    key = load_encryption_key(settings)
    account = await create_account(db, "a", encryption_key=key)
    stored = await stored_secret(db, account.account_id)
    assert is_sealed(stored) and account.signing_secret not in stored
    assert open_secret(stored, account.account_id, key) == account.signing_secret
    # Bound to its account, and to the key-encryption key.
    with pytest.raises(SigningKeyError):
        open_secret(stored, "acct_other", key)
    other_key = load_encryption_key(
        settings.model_copy(update={"webhook_encryption_key": new_encryption_key()})
    )
    with pytest.raises(SigningKeyError):
        open_secret(stored, account.account_id, other_key)
    tampered = stored[:-2] + ("A" if stored[-2] != "A" else "B") + stored[-1]
    with pytest.raises(SigningKeyError):
        open_secret(tampered, account.account_id, key)


async def test_secrets_in_clear_are_sealed_in_place(env: tuple[Settings, Database]) -> None:
    settings, db = env
    key = load_encryption_key(settings)
    await add_account(db, "acct_old", "whsec_old_one")
    await add_account(db, "acct_old2", "whsec_old_two")
    sealed_already = seal_secret("whsec_new", "acct_new", key)
    await add_account(db, "acct_new", sealed_already)
    # Until sealed, a row in clear is read as it is.
    assert SecretOpener(key)("acct_old", "whsec_old_one") == "whsec_old_one"
    assert await seal_plaintext_secrets(db, key) == 2
    assert await seal_plaintext_secrets(db, key) == 0
    async with db.read() as session:
        rows = dict((await session.execute(select(Account.id, Account.signing_secret))).all())
    assert all(is_sealed(value) for value in rows.values())
    assert rows["acct_new"] == sealed_already
    opener = SecretOpener(key)
    assert opener("acct_old", rows["acct_old"]) == "whsec_old_one"
    assert opener("acct_old2", rows["acct_old2"]) == "whsec_old_two"
    assert opener("acct_new", rows["acct_new"]) == "whsec_new"
    assert opener("acct_new", None) is None
