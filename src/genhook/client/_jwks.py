"""The webhook signing key set: parsing, caching and rate-limited refetch.

A verifier sees the key id on every delivery. An unknown id usually means the service
rotated its key, so the set is fetched again; but an attacker can send unknown ids at will,
so fetches (of any cause) are at most one per ``min_refetch_interval`` and concurrent
callers share one fetch. The set is kept as long as the service's ``Cache-Control: max-age``
says (``no-store`` or ``no-cache``: not at all), never longer than ``max_age``: a key the
service stops publishing (retired) stops verifying when that time is up.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from genhook.client._event import VerificationFailure, WebhookVerificationError
from genhook.signature import b64url_decode

Keys = dict[str, Ed25519PublicKey]
_MAX_AGE = re.compile(r"(?:^|,)\s*max-age\s*=\s*\"?(\d{1,10})\"?\s*(?:,|$)", re.IGNORECASE)


def cache_lifetime(cache_control: str | None, ceiling: float) -> float:
    """Seconds a fetched key set may be used: the response's ``max-age`` (0 for
    ``no-store``/``no-cache``), at most ``ceiling``; ``ceiling`` without a header."""
    if cache_control is None:
        return ceiling
    directives = {part.strip().split("=")[0].lower() for part in cache_control.split(",")}
    if directives & {"no-store", "no-cache"}:
        return 0.0
    match = _MAX_AGE.search(cache_control)
    return ceiling if match is None else min(ceiling, float(match.group(1)))


def parse_jwks(data: Mapping[str, Any]) -> Keys:
    """Ed25519 signing keys by kid; entries of other kinds or malformed ones are skipped."""
    keys: Keys = {}
    entries = data.get("keys")
    if not isinstance(entries, list):
        return keys
    for jwk in entries:
        if not isinstance(jwk, dict):
            continue
        kid, x = jwk.get("kid"), jwk.get("x")
        if jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
            continue
        if jwk.get("use", "sig") != "sig" or not isinstance(kid, str) or not isinstance(x, str):
            continue
        try:
            raw = b64url_decode(x)
        except ValueError:
            continue
        if len(raw) == 32:
            keys[kid] = Ed25519PublicKey.from_public_bytes(raw)
    return keys


def _unknown(kid: str) -> WebhookVerificationError:
    return WebhookVerificationError(
        VerificationFailure.UNKNOWN_KEY, f"no signing key with kid {kid!r} in the key set"
    )


class StaticKeys:
    """A key set given up front (``jwks=``); never fetched."""

    def __init__(self, jwks: Mapping[str, Any]) -> None:
        self._keys = parse_jwks(jwks)

    def key(self, kid: str) -> Ed25519PublicKey:
        try:
            return self._keys[kid]
        except KeyError:
            raise _unknown(kid) from None

    async def akey(self, kid: str) -> Ed25519PublicKey:
        return self.key(kid)


class RemoteKeys:
    """A key set fetched from a JWKS URL, cached as its ``Cache-Control`` allows and for at
    most ``max_age`` seconds."""

    def __init__(
        self,
        url: str,
        *,
        max_age: float = 3600.0,
        min_refetch_interval: float = 30.0,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.time,
        http_client: httpx.Client | None = None,
        async_http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self.url = url
        self.max_age = max_age
        self.min_refetch_interval = min_refetch_interval
        self.timeout = timeout
        self._clock = clock
        self._http = http_client
        self._ahttp = async_http_client
        self._keys: Keys = {}
        self._fetched_at: float | None = None
        self._lifetime = max_age
        self._attempted_at: float | None = None
        self._last_error: Exception | None = None
        self._lock = threading.Lock()
        self._alock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        self.fetches = 0
        """How many fetches were started; exposed for metrics and tests."""

    def _fresh(self, kid: str) -> Ed25519PublicKey | None:
        key = self._keys.get(kid)
        if key is None or self._fetched_at is None:
            return None
        if self._clock() - self._fetched_at >= self._lifetime:
            return None
        return key

    def _may_fetch(self) -> bool:
        return (
            self._attempted_at is None
            or self._clock() - self._attempted_at >= self.min_refetch_interval
        )

    def _store(self, response: httpx.Response) -> None:
        response.raise_for_status()
        data = response.json()
        if not isinstance(data, dict):
            raise ValueError("the JWKS document is not a JSON object")
        self._keys = parse_jwks(data)
        self._fetched_at = self._clock()
        self._lifetime = cache_lifetime(response.headers.get("cache-control"), self.max_age)

    def _settle(self, kid: str) -> Ed25519PublicKey:
        """After a fetch (or a refused one): the key, a stale cached key, or an error."""
        key = self._keys.get(kid)
        if key is not None:
            return key
        error = self._last_error
        if error is not None and not self._keys:
            raise WebhookVerificationError(
                VerificationFailure.KEYS_UNAVAILABLE,
                f"could not fetch the key set from {self.url}: {error!r}",
            ) from error
        raise _unknown(kid)

    def key(self, kid: str) -> Ed25519PublicKey:
        key = self._fresh(kid)
        if key is not None:
            return key
        with self._lock:
            key = self._fresh(kid)
            if key is not None or not self._may_fetch():
                return key or self._settle(kid)
            self._attempted_at = self._clock()
            self.fetches += 1
            error: Exception | None = None
            try:
                if self._http is not None:
                    self._store(self._http.get(self.url, timeout=self.timeout))
                else:
                    with httpx.Client(timeout=self.timeout) as http:
                        self._store(http.get(self.url))
            except (httpx.HTTPError, ValueError) as exc:
                error = exc
            self._last_error = error
            return self._settle(kid)

    async def akey(self, kid: str) -> Ed25519PublicKey:
        key = self._fresh(kid)
        if key is not None:
            return key
        # One lock per event loop: an asyncio.Lock must not be shared across loops.
        loop = asyncio.get_running_loop()
        if self._alock is None or self._alock[0] is not loop:
            self._alock = (loop, asyncio.Lock())
        async with self._alock[1]:
            key = self._fresh(kid)
            if key is not None or not self._may_fetch():
                return key or self._settle(kid)
            self._attempted_at = self._clock()
            self.fetches += 1
            error: Exception | None = None
            try:
                if self._ahttp is not None:
                    self._store(await self._ahttp.get(self.url, timeout=self.timeout))
                else:
                    async with httpx.AsyncClient(timeout=self.timeout) as http:
                        self._store(await http.get(self.url))
            except (httpx.HTTPError, ValueError) as exc:
                error = exc
            self._last_error = error
            return self._settle(kid)
