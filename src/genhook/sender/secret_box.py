"""Accounts' HMAC signing secrets, encrypted at rest with the key-encryption key that also
protects the Ed25519 private keys (``genhook.sender.keys``).

Unlike API keys, a signing secret cannot be stored hashed: the service needs it to sign.
It is stored as ``sealed:v1:<base64url(nonce | AES-256-GCM ciphertext)>``, with the account
id as associated data, so a sealed secret copied onto another account does not open. Rows
written by older versions hold the secret in clear; ``seal_plaintext_secrets`` (run by
``genhook serve`` and ``genhook db upgrade``) encrypts them in place, and until then such a
row is read as it is.
"""

from __future__ import annotations

import secrets

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy import select, update

from genhook.db import Account, Database
from genhook.sender.keys import SigningKeyError
from genhook.signature import b64url_decode, b64url_encode

SEALED_PREFIX = "sealed:v1:"
_CACHE_LIMIT = 10_000


def _associated(account_id: str) -> bytes:
    return b"genhook-hmac-secret:" + account_id.encode("utf-8")


def is_sealed(stored: str) -> bool:
    return stored.startswith(SEALED_PREFIX)


def seal_secret(secret: str, account_id: str, encryption_key: bytes) -> str:
    nonce = secrets.token_bytes(12)
    sealed = AESGCM(encryption_key).encrypt(nonce, secret.encode("utf-8"), _associated(account_id))
    return SEALED_PREFIX + b64url_encode(nonce + sealed)


def open_secret(stored: str, account_id: str, encryption_key: bytes) -> str:
    """The secret in clear; a row not sealed yet (an older version wrote it) as it is."""
    if not is_sealed(stored):
        return stored
    try:
        blob = b64url_decode(stored[len(SEALED_PREFIX) :])
        return (
            AESGCM(encryption_key)
            .decrypt(blob[:12], blob[12:], _associated(account_id))
            .decode("utf-8")
        )
    except Exception as exc:
        raise SigningKeyError(
            f"the signing secret of account {account_id} cannot be decrypted: wrong "
            "GENHOOK_WEBHOOK_ENCRYPTION_KEY or key file"
        ) from exc


class SecretOpener:
    """Opens secrets for signing, remembering each one (decryption per attempt adds up)."""

    def __init__(self, encryption_key: bytes) -> None:
        self._key = encryption_key
        self._opened: dict[tuple[str, str], str] = {}

    def __call__(self, account_id: str, stored: str | None) -> str | None:
        if stored is None:
            return None
        cache_key = (account_id, stored)
        secret = self._opened.get(cache_key)
        if secret is None:
            secret = open_secret(stored, account_id, self._key)
            if len(self._opened) >= _CACHE_LIMIT:
                self._opened.clear()
            self._opened[cache_key] = secret
        return secret


async def seal_plaintext_secrets(db: Database, encryption_key: bytes) -> int:
    """Encrypt every signing secret still stored in clear; returns how many were."""
    async with db.read() as session:
        rows = (await session.execute(select(Account.id, Account.signing_secret))).all()
    plain = [(account_id, stored) for account_id, stored in rows if not is_sealed(stored)]
    if not plain:
        return 0
    async with db.write() as session:
        for account_id, stored in plain:
            # Only if unchanged meanwhile (a rotation in between wins).
            await session.execute(
                update(Account)
                .where(Account.id == account_id, Account.signing_secret == stored)
                .values(signing_secret=seal_secret(stored, account_id, encryption_key))
            )
    return len(plain)
