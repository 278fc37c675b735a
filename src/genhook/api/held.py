"""A cap on requests that hold their slot while they wait: event streams and ``Prefer: wait``.

Such a request costs little while it waits but keeps one of the process's
``GENHOOK_MAX_CONCURRENT_REQUESTS`` slots for up to minutes, so one key could take every slot
and leave the other accounts 503s. Held requests are counted per account and per key
(``GENHOOK_MAX_HELD_REQUESTS_PER_ACCOUNT``, ``..._PER_KEY``), the excess answered 429 with
``Retry-After``; and all of them together may take at most ``HELD_SHARE`` of the slots, so
the rest always serves submits and polls.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from genhook.accounts import hash_key
from genhook.errors import ServiceUnavailable, TooManyRequests

# The fraction of the process's request slots that held requests may take together.
HELD_SHARE = 0.75
# A held request lasts seconds to minutes: come back after a few seconds, not at once.
HELD_RETRY_AFTER_SECONDS = 5


class Hold:
    """One held request's place in the counts; ``release`` is idempotent."""

    def __init__(self, owner: HeldRequests, account: str, key: str) -> None:
        self._owner = owner
        self._account = account
        self._key = key
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._owner.let_go(self._account, self._key)

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


class HeldRequests:
    """The counts of one API process (the slots they guard are per process too)."""

    def __init__(self, max_concurrent: int, per_account: int, per_key: int) -> None:
        self.total_cap = max(1, int(max_concurrent * HELD_SHARE))
        self.per_account = per_account
        self.per_key = per_key
        self.total = 0
        self.accounts: Counter[str] = Counter()
        self.keys: Counter[str] = Counter()

    def hold(self, account_id: str, authorization: str | None) -> Hold:
        """A place for one more held request of this account and key, or 429 (or 503 when
        held requests of every account together fill their share)."""
        key = key_identity(authorization)
        if self.keys[key] >= self.per_key:
            raise TooManyRequests(
                f"this API key already has {self.per_key} event streams or waiting requests "
                "open; close one or poll instead",
                retry_after=HELD_RETRY_AFTER_SECONDS,
            )
        if self.accounts[account_id] >= self.per_account:
            raise TooManyRequests(
                f"this account already has {self.per_account} event streams or waiting "
                "requests open; close one or poll instead",
                retry_after=HELD_RETRY_AFTER_SECONDS,
            )
        if self.total >= self.total_cap:
            raise ServiceUnavailable(
                "too many event streams and waiting requests are open; poll instead or retry"
            )
        self.total += 1
        self.accounts[account_id] += 1
        self.keys[key] += 1
        return Hold(self, account_id, key)

    def let_go(self, account_id: str, key: str) -> None:
        self.total -= 1
        for counts, name in ((self.accounts, account_id), (self.keys, key)):
            counts[name] -= 1
            if counts[name] <= 0:
                del counts[name]


def key_identity(authorization: str | None) -> str:
    """The key a request authenticated with, as its digest (never the key itself)."""
    token = (authorization or "").strip().partition(" ")[2].strip()
    return hash_key(token)


class HeldStream(StreamingResponse):
    """An event stream that gives its place back however it ends, even when the client left
    before the first byte (when the body's generator never starts, so its ``finally``
    would not run)."""

    def __init__(self, content: AsyncIterator[bytes], hold: Hold, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.hold = hold

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.hold.release()
