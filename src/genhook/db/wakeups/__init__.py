"""Wake-ups between processes: work that becomes claimable is announced, not polled for.

Two channels: ``tasks`` (a submit or a requeue; workers listen) and ``deliveries`` (a
webhook delivery became due; dispatchers listen). A writer calls ``notify(session, channel)``
inside the transaction that makes the work claimable; listeners hear of it once that
transaction commits, and never before, so a woken claim always finds the row.

Each database's processes hear each other through an adapter of the port
(``genhook.db.wakeups.port``): PostgreSQL's ``LISTEN``/``NOTIFY``
(``genhook.db.wakeups.postgres``) or, for SQLite on one machine, local datagram
sockets (``genhook.db.wakeups.sockets``), where a writer wakes one idle worker rather
than all of them.

Listeners in the writer's own process are woken directly. Wake-ups are a hint: every
listener still polls slowly (``GENHOOK_WORKER_POLL_SECONDS``,
``GENHOOK_WEBHOOK_POLL_SECONDS``), so a lost one costs latency, never a task.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from genhook.db.wakeups.port import (
    _RANK,
    CHANNELS,
    DELIVERIES,
    HUBS,
    TASKS,
    Hub,
    Subscription,
    Transport,
    Wake,
    _Subscription,
)
from genhook.db.wakeups.postgres import PG_CHANNELS, PG_NOTIFY, PostgresHub, pg_notify_params
from genhook.db.wakeups.sockets import SUN_PATH_MAX, SocketsHub, send_wakeups, wake_dir

__all__ = [
    "CHANNELS",
    "DELIVERIES",
    "PG_CHANNELS",
    "PG_NOTIFY",
    "SUN_PATH_MAX",
    "TASKS",
    "Hub",
    "Subscription",
    "Transport",
    "Waiter",
    "Wake",
    "announce",
    "committed",
    "database_key",
    "hub_for",
    "notify",
    "pg_notify_params",
    "send_wakeups",
    "subscribe",
]

_PENDING_KEY = "genhook_wakeups"
# This process's hubs, one per database and event loop.
_hubs = HUBS


def database_key(url: str | URL) -> str:
    """One database's identity in this process: listeners and writers meet under it."""
    parsed = make_url(url) if isinstance(url, str) else url
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ":memory:"
        if database != ":memory:" and not database.startswith("file:"):
            database = str(Path(database).resolve())
        return "sqlite:" + database
    return parsed.set(password=None).render_as_string(hide_password=True)


# -- notifying ----------------------------------------------------------------------------


async def notify(session: AsyncSession, channel: str) -> None:
    """Announce ``channel`` work made claimable by the session's current transaction.

    Cheap and idempotent per transaction: the announcement goes out once, at commit.
    """
    pending: _Pending | None = session.info.get(_PENDING_KEY)
    if pending is None:
        pending = session.info[_PENDING_KEY] = _Pending(_target_of(session.get_bind().engine))
    elif channel in pending.channels:
        return
    pending.channels.add(channel)
    if pending.target.postgres:
        await session.execute(PG_NOTIFY, pg_notify_params(channel))


def committed(engine: Engine, channels: set[str]) -> None:
    """After a commit made outside a session (``genhook.db.driver``): wake ``channels``."""
    target = _target_of(engine)
    for name in channels:
        announce(target.key, name, target.sqlite_path)


@dataclass(frozen=True, slots=True)
class _Target:
    """Where one engine's announcements go, worked out once per engine."""

    key: str
    sqlite_path: str | None
    postgres: bool


@dataclass(slots=True)
class _Pending:
    target: _Target
    channels: set[str] = field(default_factory=set)


_targets: weakref.WeakKeyDictionary[Engine, _Target] = weakref.WeakKeyDictionary()


def _target_of(engine: Engine) -> _Target:
    target = _targets.get(engine)
    if target is None:
        target = _targets[engine] = _target(engine)
    return target


def _target(engine: Engine) -> _Target:
    sqlite = engine.dialect.name == "sqlite"
    return _Target(
        database_key(engine.url),
        engine.url.database if sqlite else None,
        engine.dialect.name == "postgresql",
    )


# Registered once for every session: a listener added and removed per transaction cost
# more than the rest of the announcement.
@event.listens_for(Session, "after_commit")
def _after_commit(session: Session) -> None:
    pending: _Pending | None = session.info.pop(_PENDING_KEY, None)
    if pending is not None:
        for name in pending.channels:
            announce(pending.target.key, name, pending.target.sqlite_path)


@event.listens_for(Session, "after_soft_rollback")
def _after_rollback(session: Session, _previous: Any) -> None:
    session.info.pop(_PENDING_KEY, None)


def announce(key: str, channel: str, sqlite_path: str | None = None) -> None:
    """After a commit: wake this process's listeners, and on SQLite every other process's.

    On PostgreSQL other processes hear the transaction's ``pg_notify``.
    """
    for hub in list(_hubs.values()):
        if hub.key == key:
            hub.poke(channel)
    if sqlite_path:
        directory = wake_dir(sqlite_path)
        if directory is not None:
            send_wakeups(directory / channel)


# -- listening ----------------------------------------------------------------------------


class Waiter:
    """A channel's wake-ups as something to wait on (a worker between claims); one of a
    pool, so on SQLite a writer wakes one idle Waiter rather than all of them."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._wake: Wake | None = None
        self._subscription: _Subscription | None = None

    def attach(self, url: str | URL, channel: str, sqlite_path: str | None = None) -> None:
        self._subscription = _subscribe(url, channel, self._woken, sqlite_path, pooled=True)

    def _woken(self, wake: Wake) -> None:
        if self._wake is None or _RANK[wake] > _RANK[self._wake]:
            self._wake = wake
        self._event.set()

    def set(self) -> None:
        self._woken(Wake.LOCAL)

    def pending(self) -> bool:
        """Whether a wake-up arrived since the last wait."""
        return self._event.is_set()

    async def wait(self, timeout: float, *, idle: bool = True) -> Wake:
        """Until a wake-up or ``timeout`` (``Wake.TIMEOUT``); a wake-up since the last wait
        counts, so none is lost between a claim that found nothing and this wait.

        ``idle``: whether this worker would take a task now, and so may be woken alone (it
        is marked idle before waiting, so a datagram sent meanwhile is already queued).
        """
        subscription = self._subscription
        marked = idle and subscription is not None and not self._event.is_set()
        if marked and subscription is not None:
            subscription.hub.set_waiting(subscription, True)
        timed_out = False
        try:
            async with asyncio.timeout(timeout):
                await self._event.wait()
        except TimeoutError:
            timed_out = True
        finally:
            if marked and subscription is not None:
                subscription.hub.set_waiting(subscription, False)
        # Consumed only by a wait that returns: a canceled one leaves it pending.
        wake, self._wake = self._wake, None
        self._event.clear()
        if wake is not None:
            return wake
        return Wake.TIMEOUT if timed_out else Wake.LOCAL

    def close(self) -> None:
        if self._subscription is not None:
            self._subscription.close()
            self._subscription = None


def subscribe(
    url: str | URL,
    channel: str,
    callback: Callable[[], None],
    sqlite_path: str | None = None,
) -> Subscription:
    """Call ``callback`` on the running loop whenever ``channel`` work may be claimable."""
    return _subscribe(url, channel, lambda _wake: callback(), sqlite_path, pooled=False)


def _subscribe(
    url: str | URL,
    channel: str,
    callback: Callable[[Wake], None],
    sqlite_path: str | None,
    pooled: bool,
) -> _Subscription:
    if channel not in CHANNELS:
        raise ValueError(f"unknown wake-up channel {channel!r}")
    loop = asyncio.get_running_loop()
    key = database_key(url)
    hub = _hubs.get((key, id(loop)))
    if hub is None or hub.loop is not loop:
        parsed = make_url(url) if isinstance(url, str) else url
        if parsed.get_backend_name() == "postgresql":
            hub = PostgresHub(key, loop, parsed)
        else:
            path = sqlite_path if sqlite_path is not None else (parsed.database or "")
            hub = SocketsHub(key, loop, wake_dir(path))
        _hubs[(key, id(loop))] = hub
    return hub.subscribe(channel, callback, pooled)


def hub_for(url: str | URL) -> Hub | None:
    """This loop's hub for a database (tests look at its connection state)."""
    loop = asyncio.get_running_loop()
    return _hubs.get((database_key(url), id(loop)))
