"""Accounts and API keys.

Keys are shown once and stored as SHA-256 digests: a key is 256 random bits, so a fast hash
cannot be brute-forced, and lookups stay a single indexed read per request.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from sqlalchemy import delete, select, update

from genhook.db import Account, ApiKey, Database, now_ms
from genhook.db.models import ConsoleSession
from genhook.errors import NotFound, Unauthorized

KEY_PREFIX = "ghk_"


@dataclass(frozen=True, slots=True)
class NewAccount:
    account_id: str
    name: str
    api_key: str
    signing_secret: str


@dataclass(frozen=True, slots=True)
class NewKey:
    key_id: str
    account_id: str
    api_key: str
    max_priority: int | None = None


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request authenticated as: the account, and what its key may ask for."""

    account: Account
    # The highest task priority the key may ask for (``genhook.priorities``); None: any.
    max_priority: int | None = None


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()


def new_signing_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


def _new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


async def create_account(
    db: Database, name: str, *, encryption_key: bytes | None = None
) -> NewAccount:
    """``encryption_key`` (``keys.load_encryption_key``) seals the signing secret at rest;
    without it the secret is stored in clear until ``seal_plaintext_secrets`` runs."""
    account_id = "acct_" + secrets.token_hex(8)
    secret = new_signing_secret()
    stored = secret
    if encryption_key is not None:
        from genhook.sender.secret_box import seal_secret

        stored = seal_secret(secret, account_id, encryption_key)
    api_key = _new_key()
    now = now_ms()
    async with db.write() as session:
        session.add(Account(id=account_id, name=name, signing_secret=stored, created_at=now))
        await session.flush()
        session.add(_key_row(account_id, api_key, "default", now))
    return NewAccount(account_id, name, api_key, secret)


def key_prefix(api_key: str) -> str:
    """The part of a key that is stored in clear and shown in listings (``ghk_`` and 6)."""
    return api_key[: len(KEY_PREFIX) + 6]


def _key_row(
    account_id: str, api_key: str, name: str, now: int, max_priority: int | None = None
) -> ApiKey:
    return ApiKey(
        id="key_" + secrets.token_hex(8),
        account_id=account_id,
        name=name,
        prefix=key_prefix(api_key),
        key_hash=hash_key(api_key),
        created_at=now,
        revoked_at=None,
        max_priority=max_priority,
    )


async def find_account(db: Database, account: str) -> Account:
    """Look an account up by id or by name (names need not be unique; ids win)."""
    async with db.read() as session:
        row = await session.get(Account, account)
        if row is None:
            rows = (await session.scalars(select(Account).where(Account.name == account))).all()
            if len(rows) > 1:
                raise NotFound(f"several accounts are named {account!r}; use the account id")
            row = rows[0] if rows else None
    if row is None:
        raise NotFound(f"no account {account!r}")
    return row


async def list_accounts(db: Database) -> list[Account]:
    async with db.read() as session:
        return list((await session.scalars(select(Account).order_by(Account.created_at))).all())


async def update_account(db: Database, account_id: str, **values: object) -> None:
    """Set columns of one account (``standard_webhooks``, a sealed ``signing_secret``)."""
    async with db.write() as session:
        result = await session.execute(
            update(Account).where(Account.id == account_id).values(**values)
        )
        if not result.rowcount:  # type: ignore[attr-defined]
            raise NotFound(f"no account {account_id}")


async def create_key(
    db: Database, account: str, name: str = "", *, max_priority: int | None = None
) -> NewKey:
    """``max_priority``: the highest task priority the key may ask for (None: any)."""
    owner = await find_account(db, account)
    api_key = _new_key()
    row = _key_row(owner.id, api_key, name, now_ms(), max_priority)
    async with db.write() as session:
        session.add(row)
    return NewKey(row.id, owner.id, api_key, max_priority)


async def list_keys(db: Database, account: str | None = None) -> list[ApiKey]:
    stmt = select(ApiKey).order_by(ApiKey.created_at)
    if account is not None:
        stmt = stmt.where(ApiKey.account_id == (await find_account(db, account)).id)
    async with db.read() as session:
        return list((await session.scalars(stmt)).all())


async def revoke_key(db: Database, key_id: str) -> None:
    """Revoke a key, and end every console session signed in with it."""
    async with db.write() as session:
        result = await session.execute(
            update(ApiKey)
            .where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None))
            .values(revoked_at=now_ms())
        )
        await session.execute(delete(ConsoleSession).where(ConsoleSession.key_id == key_id))
        if result.rowcount == 0:  # type: ignore[attr-defined]
            exists = await session.get(ApiKey, key_id)
            if exists is None:
                raise NotFound(f"no API key {key_id!r}")


class AuthCache:
    """Remembers verified keys for ``ttl`` seconds, so a busy client costs no database read
    per request. A revocation therefore takes effect within ``ttl`` seconds everywhere (at
    once in the process that revoked). Failed lookups are never cached."""

    def __init__(self, ttl: float, max_entries: int = 10_000) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._entries: dict[str, tuple[float, Caller]] = {}

    def get(self, digest: str) -> Caller | None:
        entry = self._entries.get(digest)
        if entry is None:
            return None
        if entry[0] < time.monotonic():
            self._entries.pop(digest, None)
            return None
        return entry[1]

    def put(self, digest: str, caller: Caller) -> None:
        if self.ttl <= 0:
            return
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        self._entries[digest] = (time.monotonic() + self.ttl, caller)

    def clear(self) -> None:
        self._entries.clear()


async def authenticate(
    db: Database, authorization: str | None, cache: AuthCache | None = None
) -> Account:
    """Resolve ``Authorization: Bearer <key>`` to its account, or raise 401."""
    return (await authenticate_caller(db, authorization, cache)).account


async def authenticate_caller(
    db: Database, authorization: str | None, cache: AuthCache | None = None
) -> Caller:
    """Resolve ``Authorization: Bearer <key>`` to its account and the key's bounds, or
    raise 401."""
    if not authorization:
        raise Unauthorized("missing Authorization header; send 'Authorization: Bearer <API key>'")
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("the Authorization header must have the form 'Bearer <API key>'")
    digest = hash_key(token)
    if cache is not None and (cached := cache.get(digest)) is not None:
        return cached
    async with db.read() as session:
        row = (
            await session.execute(
                select(ApiKey.key_hash, ApiKey.revoked_at, ApiKey.max_priority, Account)
                .join(Account, Account.id == ApiKey.account_id)
                .where(ApiKey.key_hash == digest)
            )
        ).first()
    if row is None or not hmac.compare_digest(row[0], digest) or row[1] is not None:
        raise Unauthorized("invalid or revoked API key")
    caller = Caller(row[3], row[2])
    if cache is not None:
        cache.put(digest, caller)
    return caller
