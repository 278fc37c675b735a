"""Ed25519 signing keys: generation, encryption at rest, rotation with overlap, JWKS.

Private keys are stored encrypted with AES-256-GCM (the key id is bound as associated
data, so a ciphertext cannot be moved to another row). The encryption key comes from
``GENHOOK_WEBHOOK_ENCRYPTION_KEY`` (32 bytes, base64url) or, when unset, from a key file
generated once in the data directory. Several machines sharing one database must share
the setting.

Key changes (first key, rotation, retirement) run under one lock, an advisory
transaction lock on PostgreSQL and SQLite's single writer, so processes starting at once
create exactly one active key.
"""

from __future__ import annotations

import asyncio
import binascii
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)
from sqlalchemy import func, or_, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from genhook.config import Settings
from genhook.db import Database, SigningKey, now_ms
from genhook.errors import Conflict, NotFound
from genhook.files import private_dir
from genhook.signature import b64url_decode, b64url_encode

KEY_FILE_NAME = "webhook-encryption.key"
_CIPHER_VERSION = b"\x01"
# Arbitrary constant identifying the signing-key lock among PostgreSQL advisory locks.
_ADVISORY_LOCK_ID = 0x67686B01
DAY_MS = 86_400_000


class SigningKeyError(Exception):
    """The encryption key is missing, malformed, or does not open a stored key."""


def _decode_key(text_key: str) -> bytes:
    try:
        raw = b64url_decode(text_key.strip())
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32:
        raise SigningKeyError("GENHOOK_WEBHOOK_ENCRYPTION_KEY must be 32 bytes, base64url-encoded")
    return raw


def new_encryption_key() -> str:
    return b64url_encode(secrets.token_bytes(32))


def load_encryption_key(settings: Settings) -> bytes:
    """The configured key, or the data directory's key file, created on first use."""
    if settings.webhook_encryption_key:
        return _decode_key(settings.webhook_encryption_key)
    path = Path(settings.data_dir) / KEY_FILE_NAME
    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as handle:
            handle.write(new_encryption_key() + "\n")
    # A process that lost the creation race may read before the winner's write lands.
    for _ in range(50):
        content = path.read_text().strip()
        if content:
            return _decode_key(content)
        time.sleep(0.01)
    raise SigningKeyError(f"{path} is empty")


def encrypt_private_key(key: Ed25519PrivateKey, kid: str, encryption_key: bytes) -> bytes:
    raw = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    nonce = secrets.token_bytes(12)
    sealed = AESGCM(encryption_key).encrypt(nonce, raw, kid.encode("ascii"))
    return _CIPHER_VERSION + nonce + sealed


def decrypt_private_key(blob: bytes, kid: str, encryption_key: bytes) -> Ed25519PrivateKey:
    if blob[:1] != _CIPHER_VERSION:
        raise SigningKeyError(f"signing key {kid}: unknown encryption format")
    try:
        raw = AESGCM(encryption_key).decrypt(blob[1:13], blob[13:], kid.encode("ascii"))
    except Exception as exc:
        raise SigningKeyError(
            f"signing key {kid} cannot be decrypted: wrong GENHOOK_WEBHOOK_ENCRYPTION_KEY "
            "or key file"
        ) from exc
    return Ed25519PrivateKey.from_private_bytes(raw)


def public_x(key: Ed25519PrivateKey) -> str:
    return b64url_encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))


@dataclass(frozen=True, slots=True)
class ActiveKey:
    kid: str
    private_key: Ed25519PrivateKey


@dataclass(frozen=True, slots=True)
class KeyInfo:
    kid: str
    status: str
    public_x: str
    created_at: int
    rotated_at: int | None
    retire_at: int | None
    published: bool


def _new_row(encryption_key: bytes, now: int) -> SigningKey:
    kid = "key_" + secrets.token_hex(8)
    private = Ed25519PrivateKey.generate()
    return SigningKey(
        kid=kid,
        status="active",
        public_x=public_x(private),
        private_key_encrypted=encrypt_private_key(private, kid, encryption_key),
        created_at=now,
        rotated_at=None,
        retire_at=None,
    )


async def _lock(db: Database, session: AsyncSession) -> None:
    if db.is_postgres:
        await session.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _ADVISORY_LOCK_ID})


async def _active(session: AsyncSession) -> SigningKey | None:
    rows = await session.scalars(
        select(SigningKey).where(SigningKey.status == "active").order_by(SigningKey.created_at)
    )
    return rows.first()


async def ensure_signing_key(db: Database, settings: Settings) -> None:
    """Create the first active key if there is none; safe when processes start together."""
    encryption_key = load_encryption_key(settings)
    async with db.read() as session:
        existing = await _active(session)
    if existing is not None:
        decrypt_private_key(existing.private_key_encrypted, existing.kid, encryption_key)
        return
    async with db.write() as session:
        await _lock(db, session)
        if await _active(session) is None:
            session.add(_new_row(encryption_key, now_ms()))


async def rotate_signing_key(db: Database, settings: Settings, *, now: int | None = None) -> str:
    """Make a new active key; the old one stays published for the configured overlap."""
    encryption_key = load_encryption_key(settings)
    moment = now if now is not None else now_ms()
    overlap_ms = int(settings.webhook_key_overlap_days * DAY_MS)
    async with db.write() as session:
        await _lock(db, session)
        await session.execute(
            update(SigningKey)
            .where(SigningKey.status == "active")
            .values(status="rotated", rotated_at=moment, retire_at=moment + overlap_ms)
        )
        row = _new_row(encryption_key, moment)
        session.add(row)
    return row.kid


async def retire_signing_key(db: Database, kid: str, *, now: int | None = None) -> None:
    """Stop publishing a rotated key now (for a compromised key, or to end an overlap early)."""
    moment = now if now is not None else now_ms()
    async with db.write() as session:
        await _lock(db, session)
        row = await session.get(SigningKey, kid)
        if row is None:
            raise NotFound(f"no signing key {kid}")
        if row.status == "active":
            raise Conflict(f"{kid} is the active key; rotate first, then retire it")
        row.status = "retired"
        row.retire_at = min(row.retire_at or moment, moment)


async def retire_expired_keys(db: Database, *, now: int | None = None) -> int:
    moment = now if now is not None else now_ms()
    due = (SigningKey.status == "rotated", SigningKey.retire_at <= moment)
    async with db.read() as session:  # read first: an idle service writes nothing
        if await session.scalar(select(SigningKey.kid).where(*due).limit(1)) is None:
            return 0
    async with db.write() as session:
        result = await session.execute(update(SigningKey).where(*due).values(status="retired"))
    return int(result.rowcount)  # type: ignore[attr-defined]


async def list_signing_keys(db: Database, *, now: int | None = None) -> list[KeyInfo]:
    moment = now if now is not None else now_ms()
    async with db.read() as session:
        rows = (await session.scalars(select(SigningKey).order_by(SigningKey.created_at))).all()
    return [
        KeyInfo(
            kid=row.kid,
            status=row.status,
            public_x=row.public_x,
            created_at=row.created_at,
            rotated_at=row.rotated_at,
            retire_at=row.retire_at,
            published=_published(row, moment),
        )
        for row in rows
    ]


def _published(row: SigningKey, now: int) -> bool:
    if row.status == "active":
        return True
    return row.status == "rotated" and row.retire_at is not None and row.retire_at > now


# How long a verifier may cache the key set: an early retirement (a compromised key) reaches
# every verifier that honours ``Cache-Control`` within this time.
JWKS_MAX_AGE_SECONDS = 300


async def jwks_max_age(db: Database, *, now: int | None = None) -> int:
    """Seconds the key set may be cached: ``JWKS_MAX_AGE_SECONDS``, or less when a rotated
    key's overlap ends sooner, so that caches drop it when it stops being published."""
    moment = now if now is not None else now_ms()
    async with db.read() as session:
        next_retirement = await session.scalar(
            select(func.min(SigningKey.retire_at)).where(
                SigningKey.status == "rotated", SigningKey.retire_at > moment
            )
        )
    if next_retirement is None:
        return JWKS_MAX_AGE_SECONDS
    return min(JWKS_MAX_AGE_SECONDS, max(0, (int(next_retirement) - moment) // 1000))


async def jwks(db: Database, *, now: int | None = None) -> dict[str, list[dict[str, str]]]:
    """The published key set: the active key and rotated keys still inside their overlap."""
    moment = now if now is not None else now_ms()
    async with db.read() as session:
        rows = (
            await session.scalars(
                select(SigningKey)
                .where(
                    or_(
                        SigningKey.status == "active",
                        (SigningKey.status == "rotated") & (SigningKey.retire_at > moment),
                    )
                )
                .order_by(SigningKey.created_at.desc())
            )
        ).all()
    return {
        "keys": [
            {
                "kty": "OKP",
                "crv": "Ed25519",
                "x": row.public_x,
                "use": "sig",
                "alg": "EdDSA",
                "kid": row.kid,
            }
            for row in rows
        ]
    }


class KeyRing:
    """The active signing key, decrypted once and re-read at most every ``refresh_ms``, so a
    rotation made by another process (the CLI) takes effect within that time."""

    def __init__(self, db: Database, settings: Settings, *, refresh_ms: int = 2000) -> None:
        self._db = db
        self._encryption_key = load_encryption_key(settings)
        self._refresh_ms = refresh_ms
        self._active: ActiveKey | None = None
        self._checked_at = 0
        self._cache: dict[str, Ed25519PrivateKey] = {}
        self._lock = asyncio.Lock()

    async def active(self) -> ActiveKey:
        if self._active is not None and now_ms() - self._checked_at < self._refresh_ms:
            return self._active
        # One refresh at a time: every in-flight attempt may ask at the same moment.
        async with self._lock:
            return await self._refresh()

    async def _refresh(self) -> ActiveKey:
        now = now_ms()
        if self._active is None or now - self._checked_at >= self._refresh_ms:
            async with self._db.read() as session:
                row = await _active(session)
            if row is None:
                raise SigningKeyError("no active signing key; the service creates one at start")
            private = self._cache.get(row.kid)
            if private is None:
                private = decrypt_private_key(
                    row.private_key_encrypted, row.kid, self._encryption_key
                )
                self._cache[row.kid] = private
            self._active = ActiveKey(row.kid, private)
            self._checked_at = now
        return self._active
