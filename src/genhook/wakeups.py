"""Wake-ups between processes: work that becomes claimable is announced, not polled for.

Two channels: ``tasks`` (a submit or a requeue; workers listen) and ``deliveries`` (a
webhook delivery became due; dispatchers listen). A writer calls ``notify(session, channel)``
inside the transaction that makes the work claimable; listeners hear of it once that
transaction commits, and never before, so a woken claim always finds the row.

- PostgreSQL: ``pg_notify`` in the transaction (PostgreSQL delivers it at commit) and one
  dedicated asyncpg ``LISTEN`` connection per process and event loop, reconnected with the
  shared backoff after a database restart.
- SQLite: a Unix datagram socket per listening process and channel under
  ``<database directory>/wake/<channel>/`` (0700); after commit the writer sends one byte
  to each and removes sockets nobody listens on any more. A path longer than ``sun_path``
  allows is bound in Linux's abstract namespace under a hash of that path, with a plain
  file at the path so writers still find it.

Listeners in the writer's own process are woken directly. Wake-ups are a hint: every
listener still polls slowly (``GENHOOK_WORKER_POLL_SECONDS``,
``GENHOOK_WEBHOOK_POLL_SECONDS``), so a lost one costs latency, never a task.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import secrets
import socket
import stat
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import event, text
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from genhook.files import private_dir
from genhook.retry import backoff_delay

log = logging.getLogger(__name__)

TASKS = "tasks"
DELIVERIES = "deliveries"
CHANNELS = (TASKS, DELIVERIES)
# PostgreSQL channel names, shared by every process on the database.
PG_CHANNELS = {channel: f"genhook_{channel}" for channel in CHANNELS}
# The longest socket path ``bind`` takes on Linux (``sun_path`` less its terminating NUL).
SUN_PATH_MAX = 107
# How often an idle LISTEN connection is checked with a query (a read, never a write).
PG_CHECK_SECONDS = 30.0

_PENDING_KEY = "genhook_wakeups"


def database_key(url: str | URL) -> str:
    """One database's identity in this process: listeners and writers meet under it."""
    parsed = make_url(url) if isinstance(url, str) else url
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ":memory:"
        if database != ":memory:" and not database.startswith("file:"):
            database = str(Path(database).resolve())
        return "sqlite:" + database
    return parsed.set(password=None).render_as_string(hide_password=True)


def wake_dir(sqlite_path: str) -> Path | None:
    """Where an SQLite database's listeners keep their sockets (None: in memory only)."""
    if not sqlite_path or sqlite_path == ":memory:" or sqlite_path.startswith("file:"):
        return None
    return Path(sqlite_path).resolve().parent / "wake"


def abstract_address(path: Path) -> bytes:
    """The abstract-namespace address used for a socket path too long to bind."""
    digest = hashlib.sha256(os.fsencode(path)).hexdigest()[:40]
    return b"\0genhook-wake-" + digest.encode()


# -- notifying ----------------------------------------------------------------------------


async def notify(session: AsyncSession, channel: str) -> None:
    """Announce ``channel`` work made claimable by the session's current transaction.

    Cheap and idempotent per transaction: the announcement goes out once, at commit.
    """
    pending: _Pending | None = session.info.get(_PENDING_KEY)
    if pending is None:
        engine = session.get_bind().engine
        target = _targets.get(engine)
        if target is None:
            target = _targets[engine] = _target(engine)
        pending = session.info[_PENDING_KEY] = _Pending(target)
    elif channel in pending.channels:
        return
    pending.channels.add(channel)
    if pending.target.postgres:
        # The payload names this process, whose own listeners ``announce`` wakes at commit.
        statement = text("SELECT pg_notify(:channel, :sender)")
        params = {"channel": PG_CHANNELS[channel], "sender": str(os.getpid())}
        await session.execute(statement, params)


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


def send_wakeups(directory: Path) -> int:
    """One byte to every other process's socket in ``directory``; removes stale ones.

    Returns how many sockets were sent to.
    """
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return 0
    mine = f"{os.getpid()}-"
    sent = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        sender.setblocking(False)
        for entry in entries:
            if entry.name.startswith(mine):
                continue  # this process's own listeners were woken directly
            path = Path(entry.path)
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
                address: str | bytes = entry.path if stat.S_ISSOCK(mode) else abstract_address(path)
                sender.sendto(b"!", address)
                sent += 1
            except BlockingIOError:
                sent += 1  # its queue is full: it has wake-ups to read already
            except OSError as error:
                if error.errno in (errno.ECONNREFUSED, errno.ENOENT):
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()  # its process is gone
                else:
                    log.debug("wake-up to %s failed: %s", path, error)
    return sent


# -- listening ----------------------------------------------------------------------------


class Subscription(Protocol):
    def close(self) -> None: ...


class _Subscription:
    def __init__(self, hub: _Hub, channel: str, callback: Callable[[], None]) -> None:
        self.hub = hub
        self.channel = channel
        self.callback = callback

    def close(self) -> None:
        self.hub.unsubscribe(self)


class Waiter:
    """A channel's wake-ups as something to wait on (a worker between claims)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._subscription: Subscription | None = None

    def attach(self, url: str | URL, channel: str, sqlite_path: str | None = None) -> None:
        self._subscription = subscribe(url, channel, self._event.set, sqlite_path)

    def set(self) -> None:
        self._event.set()

    def pending(self) -> bool:
        """Whether a wake-up arrived since the last wait."""
        return self._event.is_set()

    async def wait(self, timeout: float) -> bool:
        """Until a wake-up (True) or ``timeout`` (False); a wake-up since the last wait
        counts, so none is lost between a claim that found nothing and this wait."""
        try:
            async with asyncio.timeout(timeout):
                await self._event.wait()
        except TimeoutError:
            return False
        finally:
            self._event.clear()
        return True

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
    if channel not in CHANNELS:
        raise ValueError(f"unknown wake-up channel {channel!r}")
    loop = asyncio.get_running_loop()
    key = database_key(url)
    hub = _hubs.get((key, id(loop)))
    if hub is None or hub.loop is not loop:
        parsed = make_url(url) if isinstance(url, str) else url
        if parsed.get_backend_name() == "postgresql":
            hub = _PostgresHub(key, loop, parsed)
        else:
            path = sqlite_path if sqlite_path is not None else (parsed.database or "")
            hub = _SQLiteHub(key, loop, wake_dir(path))
        _hubs[(key, id(loop))] = hub
    return hub.subscribe(channel, callback)


class _Hub:
    """This process's listening on one database, from one event loop."""

    def __init__(self, key: str, loop: asyncio.AbstractEventLoop) -> None:
        self.key = key
        self.loop = loop
        self.subscriptions: dict[str, list[_Subscription]] = {c: [] for c in CHANNELS}

    def subscribe(self, channel: str, callback: Callable[[], None]) -> Subscription:
        subscription = _Subscription(self, channel, callback)
        first = not self.subscriptions[channel]
        self.subscriptions[channel].append(subscription)
        if first:
            self.open_channel(channel)
        return subscription

    def unsubscribe(self, subscription: _Subscription) -> None:
        listeners = self.subscriptions[subscription.channel]
        with contextlib.suppress(ValueError):
            listeners.remove(subscription)
        if not listeners:
            self.close_channel(subscription.channel)
        if not any(self.subscriptions.values()):
            self.close()
            if _hubs.get((self.key, id(self.loop))) is self:
                del _hubs[(self.key, id(self.loop))]

    def poke(self, channel: str) -> None:
        """From any thread: run the channel's callbacks on the hub's loop."""
        if not self.subscriptions[channel]:
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed
            self.loop.call_soon_threadsafe(self.deliver, channel)

    def deliver(self, channel: str) -> None:
        for subscription in list(self.subscriptions[channel]):
            try:
                subscription.callback()
            except Exception:
                log.exception("wake-up listener failed")

    def open_channel(self, channel: str) -> None: ...

    def close_channel(self, channel: str) -> None: ...

    def close(self) -> None: ...


class _SQLiteHub(_Hub):
    def __init__(self, key: str, loop: asyncio.AbstractEventLoop, directory: Path | None) -> None:
        super().__init__(key, loop)
        self.directory = directory
        self.sockets: dict[str, tuple[socket.socket, Path]] = {}

    def open_channel(self, channel: str) -> None:
        if self.directory is None:
            return  # an in-memory database has no other process to hear from
        try:
            self.sockets[channel] = self._bind(self.directory / channel)
        except OSError as error:
            log.warning("no wake-up socket for %s (%s); polling only", channel, error)
            return
        sock, _ = self.sockets[channel]
        self.loop.add_reader(sock.fileno(), self._drain, sock, channel)

    def _bind(self, directory: Path) -> tuple[socket.socket, Path]:
        private_dir(directory)
        path = directory / f"{os.getpid()}-{secrets.token_hex(4)}.sock"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            if len(os.fsencode(path)) <= SUN_PATH_MAX:
                sock.bind(str(path))
                os.chmod(path, 0o600)
            else:
                sock.bind(abstract_address(path))
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except BaseException:
            sock.close()
            raise
        return sock, path

    def _drain(self, sock: socket.socket, channel: str) -> None:
        woken = False
        while True:
            try:
                sock.recv(64)
                woken = True
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
        if woken:
            self.deliver(channel)

    def close_channel(self, channel: str) -> None:
        entry = self.sockets.pop(channel, None)
        if entry is None:
            return
        sock, path = entry
        with contextlib.suppress(Exception):
            self.loop.remove_reader(sock.fileno())
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

    def close(self) -> None:
        for channel in list(self.sockets):
            self.close_channel(channel)


class _PostgresHub(_Hub):
    """One LISTEN connection for both channels, kept open by a task on the hub's loop."""

    def __init__(self, key: str, loop: asyncio.AbstractEventLoop, url: URL) -> None:
        super().__init__(key, loop)
        self.dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self.connected = asyncio.Event()
        self.connections = 0  # connections made so far; a reconnect adds one
        self._task: asyncio.Task[None] | None = None
        self._connection: Any = None

    def open_channel(self, channel: str) -> None:
        if self._task is None:
            self._task = self.loop.create_task(self._listen_forever())

    def _on_notify(self, _connection: Any, _pid: int, name: str, payload: str) -> None:
        if payload == str(os.getpid()):
            return  # sent by this process, whose listeners were woken at its commit
        for channel, pg_name in PG_CHANNELS.items():
            if pg_name == name:
                self.deliver(channel)

    async def _listen_forever(self) -> None:
        import asyncpg

        failures = 0
        while True:
            lost = asyncio.Event()
            connection: Any = None
            try:
                connection = await asyncpg.connect(self.dsn, timeout=10)
                connection.add_termination_listener(partial(_set_when_closed, lost))
                for name in PG_CHANNELS.values():
                    await connection.add_listener(name, self._on_notify)
                self._connection = connection
                self.connections += 1
                failures = 0
                self.connected.set()
                # Whatever was announced while no connection listened is claimable now.
                for channel in CHANNELS:
                    self.deliver(channel)
                while not lost.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), PG_CHECK_SECONDS)
                    if not lost.is_set():
                        await asyncio.wait_for(connection.fetchval("SELECT 1"), 10)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.warning("wake-up connection to PostgreSQL lost (%s); polling meanwhile", error)
            finally:
                self.connected.clear()
                self._connection = None
                if connection is not None:
                    connection.terminate()
            failures += 1
            await asyncio.sleep(backoff_delay(failures, 0.2, 5.0))

    def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()


def _set_when_closed(lost: asyncio.Event, _connection: Any) -> None:
    lost.set()


_hubs: dict[tuple[str, int], _Hub] = {}


def hub_for(url: str | URL) -> _Hub | None:
    """This loop's hub for a database (tests look at its connection state)."""
    loop = asyncio.get_running_loop()
    return _hubs.get((database_key(url), id(loop)))
