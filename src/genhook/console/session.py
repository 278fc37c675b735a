"""The console's sessions, CSRF tokens and sign-in throttle.

A session is kept by the server (``console_sessions``): the cookie holds only a random
token, and the row holds the token's SHA-256 and the API key sealed with a key derived from
the token. A copied cookie therefore works only while its row exists: sign-out deletes it,
revoking the key deletes every session of that key (``accounts.revoke_key``), and it ends
after ``MAX_AGE_SECONDS`` anyway. The cookie is HttpOnly (no script reads it),
SameSite=Strict and Secure on https. Every page acts with the session's key through the
public API, so the console can do no more than the key can.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections import deque

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy import delete, select
from starlette.requests import Request
from starlette.responses import Response

from genhook.accounts import hash_key
from genhook.db import ApiKey, Database, now_ms
from genhook.db.models import ConsoleSession

COOKIE = "genhook_console"
MAX_AGE_SECONDS = 12 * 3600


def csrf_token(token: str) -> str:
    """The CSRF token of the session whose cookie token is ``token``: derived from a secret
    only that session's browser holds (its cookie is HttpOnly), valid on every process."""
    digest = hashlib.sha256(b"genhook-console-csrf|" + token.encode()).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def check_csrf(token: str, sent: str | None) -> bool:
    return sent is not None and hmac.compare_digest(sent, csrf_token(token))


def set_session(response: Response, request: Request, value: str) -> None:
    response.set_cookie(
        COOKIE,
        value,
        max_age=MAX_AGE_SECONDS,
        path="/console",
        httponly=True,
        secure=request.url.scheme == "https",
        samesite="strict",
    )


def clear_session(response: Response, request: Request) -> None:
    response.delete_cookie(
        COOKIE,
        path="/console",
        httponly=True,
        secure=request.url.scheme == "https",
        samesite="strict",
    )


def same_origin(request: Request) -> bool:
    """A form post from another site is refused even before its CSRF token is looked at."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    return origin.rstrip("/") == f"{request.url.scheme}://{request.url.netloc}"


def _session_id(token: str) -> str:
    return hashlib.sha256(b"genhook-console-session|" + token.encode()).hexdigest()


def _sealer(token: str) -> AESGCM:
    return AESGCM(hashlib.sha256(b"genhook-console-key|" + token.encode()).digest())


async def open_session(db: Database, api_key: str) -> str | None:
    """A new session for a valid key: the cookie's token, or None for an unknown or revoked
    key. Sessions past their end are cleared on the way."""
    async with db.read() as session:
        row = (
            await session.execute(
                select(ApiKey.id, ApiKey.account_id).where(
                    ApiKey.key_hash == hash_key(api_key), ApiKey.revoked_at.is_(None)
                )
            )
        ).first()
    if row is None:
        return None
    token = secrets.token_urlsafe(32)
    session_id = _session_id(token)
    nonce = secrets.token_bytes(12)
    sealed = nonce + _sealer(token).encrypt(nonce, api_key.encode(), session_id.encode())
    now = now_ms()
    async with db.write() as session:
        await session.execute(delete(ConsoleSession).where(ConsoleSession.expires_at <= now))
        session.add(
            ConsoleSession(
                id=session_id,
                key_id=row[0],
                account_id=row[1],
                sealed_key=sealed,
                created_at=now,
                expires_at=now + MAX_AGE_SECONDS * 1000,
            )
        )
    return token


async def session_key(db: Database, token: str | None) -> str | None:
    """The API key of the session this cookie names, or None when there is none (signed
    out, revoked, expired, or never issued)."""
    if not token or len(token) > 100:
        return None
    session_id = _session_id(token)
    async with db.read() as session:
        row = (
            await session.execute(
                select(ConsoleSession.sealed_key, ConsoleSession.expires_at).where(
                    ConsoleSession.id == session_id
                )
            )
        ).first()
    if row is None or row[1] <= now_ms():
        return None
    sealed: bytes = row[0]
    try:
        return _sealer(token).decrypt(sealed[:12], sealed[12:], session_id.encode()).decode()
    except (InvalidTag, ValueError):
        return None


async def close_session(db: Database, token: str | None) -> None:
    if token:
        async with db.write() as session:
            await session.execute(
                delete(ConsoleSession).where(ConsoleSession.id == _session_id(token))
            )


class SignInThrottle:
    """Sign-in attempts per client address and key prefix (failures) and per account
    (sessions opened), each at most ``limit`` within ``window`` seconds, counted in this
    process. Failures count per address *and* prefix so that, behind one proxy or NAT
    address, a stranger's wrong keys never lock out the users of other keys: a key is 256
    random bits, so what the throttle stops is retrying one key, not guessing one."""

    def __init__(self, limit: int = 10, window: float = 300.0, max_entries: int = 10_000) -> None:
        self.limit = limit
        self.window = window
        self.max_entries = max_entries
        self._seen: dict[str, deque[float]] = {}

    def wait_seconds(self, *names: str) -> int:
        """Seconds until each of ``names`` may try again; 0 when all may now."""
        now = time.monotonic()
        wait = 0.0
        for name in names:
            times = self._seen.get(name)
            while times and now - times[0] >= self.window:
                times.popleft()
            if times is not None and len(times) >= self.limit:
                wait = max(wait, self.window - (now - times[0]))
        return int(wait) + 1 if wait else 0

    def count(self, name: str) -> None:
        if len(self._seen) >= self.max_entries and name not in self._seen:
            self._seen.clear()
        self._seen.setdefault(name, deque()).append(time.monotonic())
