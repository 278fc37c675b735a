"""Faults of the service's own infrastructure (storage, database), told apart from engine
errors and bad input.

A full disk or a database restart is nobody's fault but the service's: a task that meets one
is retried and then requeued (never failed with an engine error, never charged a lost
lease), and a request that meets one is answered 503 with ``Retry-After`` (never 500).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sqlalchemy import exc as sa_exc

from genhook.retry import backoff_delay

log = logging.getLogger(__name__)

T = TypeVar("T")

# Seconds a client is told to wait before retrying a request refused for such a fault.
RETRY_AFTER_SECONDS = 1


class StorageUnavailable(ConnectionError):
    """A blob store that cannot serve the service right now (a bucket unreachable, timing
    out, failing or refusing its credentials): the service's fault, cured by a retry."""


def is_infrastructure_error(error: BaseException) -> bool:
    """True for storage and database failures that a retry later can cure.

    The driver's own error may sit a few links down the chain: SQLAlchemy wraps the asyncpg
    dialect's adapter error, which wraps asyncpg's (``CannotConnectNowError`` while
    PostgreSQL shuts down or starts), so every cause is looked at.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen and len(seen) < 8:
        seen.add(id(current))
        if _is_transient(current):
            return True
        orig = getattr(current, "orig", None)
        nested = orig if isinstance(orig, BaseException) else None
        current = nested or current.__cause__
    return False


def describe(error: BaseException) -> str:
    """One line naming the root cause of an infrastructure error (the driver's or the
    system's error, not SQLAlchemy's wrapper), for a log line or an answer."""
    seen: set[int] = set()
    current: BaseException = error
    while len(seen) < 8:
        seen.add(id(current))
        orig = getattr(current, "orig", None)
        nested = orig if isinstance(orig, BaseException) else current.__cause__
        if nested is None or id(nested) in seen:
            break
        current = nested
    text = str(current).strip().splitlines()
    return f"{type(current).__name__}: {text[0]}" if text else type(current).__name__


def fault_cause(error: BaseException) -> str:
    """What kind of infrastructure fault ``error`` is, in words a client may read (never
    the driver's text, which can name hosts and paths)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen and len(seen) < 8:
        seen.add(id(current))
        full = isinstance(current, OSError) and current.errno == errno.ENOSPC
        if full or "disk is full" in str(current).lower():
            return "the disk is full"
        if isinstance(current, StorageUnavailable):
            return "the blob store is unavailable"
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else current.__cause__
    return "the database or the storage is unavailable"


def _is_transient(error: BaseException) -> bool:
    if isinstance(error, sa_exc.TimeoutError):  # no pool slot within the pool timeout
        return True
    if isinstance(error, sa_exc.PendingRollbackError | sa_exc.DisconnectionError):
        return True  # a connection dropped mid-transaction (a database restart)
    if isinstance(error, sa_exc.DBAPIError):
        if error.connection_invalidated:
            return True
        if isinstance(error, sa_exc.OperationalError | sa_exc.InterfaceError):
            return True
    if isinstance(error, OSError | ConnectionError | asyncio.TimeoutError):
        return True
    # asyncpg's connection-level errors, without importing asyncpg on SQLite-only installs.
    kind = type(error)
    return kind.__module__.startswith("asyncpg") and kind.__name__ in _ASYNCPG_TRANSIENT


_ASYNCPG_TRANSIENT = frozenset(
    {
        "AdminShutdownError",
        "CannotConnectNowError",
        "ConnectionDoesNotExistError",
        "ConnectionFailureError",
        "CrashShutdownError",
        "InterfaceError",
        "TooManyConnectionsError",
    }
)


async def retry_infrastructure(
    operation: Callable[[], Awaitable[T]],
    *,
    what: str,
    budget_seconds: float,
    base: float = 0.05,
    cap: float = 2.0,
) -> T:
    """Run ``operation``, retrying infrastructure errors with the shared backoff for up to
    ``budget_seconds``; any other error, or the last infrastructure error, is raised."""
    started = time.monotonic()
    attempt = 0
    while True:
        try:
            return await operation()
        except Exception as error:
            if not is_infrastructure_error(error):
                raise
            attempt += 1
            delay = backoff_delay(attempt, base, cap)
            if time.monotonic() - started + delay > budget_seconds:
                raise
            log.warning("%s failed (%s); retrying in %.2f s", what, error, delay)
            await asyncio.sleep(delay)
