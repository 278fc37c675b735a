"""The console's session cookie and CSRF tokens.

The cookie carries the API key the person signed in with, signed by the server so it cannot
be forged or altered; it is HttpOnly (no script reads it), SameSite=Strict and Secure on
https. Every page then acts with that key through the public API, so the console can do no
more than the key can.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time

from starlette.requests import Request
from starlette.responses import Response

COOKIE = "genhook_console"
MAX_AGE_SECONDS = 12 * 3600


class SessionSigner:
    """Signs and checks session cookies and derives each session's CSRF token."""

    def __init__(self, secret: str | None) -> None:
        # Unset: a per-process secret, so sessions end when the process restarts.
        raw = secret.encode() if secret else secrets.token_bytes(32)
        self._key = hashlib.sha256(b"genhook-console|" + raw).digest()

    def _mac(self, label: str, value: str) -> str:
        digest = hmac.new(self._key, f"{label}|{value}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def cookie_value(self, api_key: str, now: float | None = None) -> str:
        issued = str(int(now if now is not None else time.time()))
        payload = base64.urlsafe_b64encode(api_key.encode()).decode().rstrip("=")
        return f"{payload}.{issued}.{self._mac('session', payload + '.' + issued)}"

    def api_key(self, cookie: str | None, now: float | None = None) -> str | None:
        """The signed-in key, or None for a missing, altered or expired cookie."""
        if not cookie or cookie.count(".") != 2:
            return None
        payload, issued, mac = cookie.split(".")
        if not hmac.compare_digest(mac, self._mac("session", payload + "." + issued)):
            return None
        if not issued.isdigit():
            return None
        if (now if now is not None else time.time()) - int(issued) > MAX_AGE_SECONDS:
            return None
        try:
            return base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode()
        except (ValueError, UnicodeDecodeError):
            return None

    def csrf_token(self, api_key: str) -> str:
        return self._mac("csrf", api_key)

    def check_csrf(self, api_key: str, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(token, self.csrf_token(api_key))


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
