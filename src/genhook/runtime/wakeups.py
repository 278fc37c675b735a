"""Wake-ups between processes: work that becomes claimable is announced, not polled for.

Two channels: ``tasks`` (a submit or a requeue; workers listen) and ``deliveries`` (a
webhook delivery became due; dispatchers listen). A writer calls ``notify(session, channel)``
inside the transaction that makes the work claimable; listeners hear of it once that
transaction commits, and never before, so a woken claim always finds the row.

- PostgreSQL: ``pg_notify`` in the transaction (PostgreSQL delivers it at commit) and one
  dedicated asyncpg ``LISTEN`` connection per process and event loop, reconnected with the
  shared backoff after a database restart. Every listener hears every announcement.
- SQLite: a Unix datagram socket per listening process and channel under
  ``<database directory>/wake/<channel>/`` (0700). A path longer than ``sun_path`` allows
  is bound in Linux's abstract namespace under a hash of its state-free name
  (``<pid>-<token>.sock``), with a plain file at the path so writers still find it.

On SQLite a worker's socket (a ``Waiter``, one of a pool that any member can serve) is named
``<pid>-<token>.idle.sock`` while one of its process's Waiters waits and
``<pid>-<token>.busy.sock`` otherwise; every other socket is ``<pid>-<token>.sock`` and gets
every announcement. After commit the writer sends ``!`` (for everyone) to each plain socket,
then takes one idle socket by renaming it to its busy name and sends it ``1`` (for it
alone): ``rename`` is atomic, so of two writers racing for one idle worker exactly one wins,
and the other takes the next idle one. That worker claims at once, without reading first.
Only when no idle socket can be taken does the writer send ``!`` to every pooled one.
Sockets nobody is bound to any more (``ECONNREFUSED``, ``ENOENT``) are removed.

No announcement is lost on SQLite while its workers live, because a worker marks itself
idle (renames busy to idle) before it waits, never after, and claims again after a task when
a wake-up arrived meanwhile (``Waiter.pending``):

- A writer that took an idle socket sent to a worker that was waiting then. If its wait ended
  meanwhile (the poll), the datagram is still queued and counts as a pending wake-up.
- A writer that found no idle socket sent to every busy one, including a worker that went
  idle just after the writer looked (a send that meets the other name follows the rename).
  The datagram waits in the socket's queue, so the wait that follows returns at once.
- A worker that looked (read or claimed) before a commit and found nothing is, at that
  writer's scan either still busy (the writer then took another, idle worker, or sent to
  every busy one) or already idle (and may be the one taken). Datagrams read together
  before one claim make one wake-up, but each belongs to a commit that claim sees, and the
  claim reports whether a second task waited (``Lifecycle.claim_next``), so the worker
  claims again after its task.

Only a worker killed just after a writer took it drops a wake-up; its task waits for another
worker's poll.

Listeners in the writer's own process are woken directly. Wake-ups are a hint: every
listener still polls slowly (``GENHOOK_WORKER_POLL_SECONDS``,
``GENHOOK_WEBHOOK_POLL_SECONDS``), so a lost one costs latency, never a task.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import functools
import hashlib
import logging
import os
import random
import secrets
import socket
import stat
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import event, text
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from genhook.db.held_connection import hold_connection
from genhook.files import private_dir

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

# Socket names on SQLite: a pooled listener's, by state, and everyone else's.
IDLE = ".idle.sock"
BUSY = ".busy.sock"
PLAIN = ".sock"
# What a datagram says: there is work, for everyone; or for the one socket it was sent to.
BROADCAST_BYTE = b"!"
TARGETED_BYTE = b"1"


def database_key(url: str | URL) -> str:
    """One database's identity in this process: listeners and writers meet under it."""
    parsed = make_url(url) if isinstance(url, str) else url
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ":memory:"
        if database != ":memory:" and not database.startswith("file:"):
            database = str(Path(database).resolve())
        return "sqlite:" + database
    return parsed.set(password=None).render_as_string(hide_password=True)


@functools.lru_cache(maxsize=64)
def wake_dir(sqlite_path: str) -> Path | None:
    """Where an SQLite database's listeners keep their sockets (None: in memory only).
    Remembered: every commit asks, and resolving the path costs a system call a component."""
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
        pending = session.info[_PENDING_KEY] = _Pending(_target_of(session.get_bind().engine))
    elif channel in pending.channels:
        return
    pending.channels.add(channel)
    if pending.target.postgres:
        await session.execute(PG_NOTIFY, pg_notify_params(channel))


PG_NOTIFY = text("SELECT pg_notify(:channel, :sender)")


def pg_notify_params(channel: str) -> dict[str, str]:
    """``PG_NOTIFY``'s parameters for ``channel``: the payload names this process, whose own
    listeners ``announce`` wakes at commit."""
    return {"channel": PG_CHANNELS[channel], "sender": str(os.getpid())}


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


def send_wakeups(directory: Path) -> int:
    """Wake other processes' sockets in ``directory`` (see the module docstring): every plain
    one, and one idle pooled one, or every pooled one when none is idle. Removes stale ones.

    Returns how many sockets were sent to.
    """
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return 0
    mine = f"{os.getpid()}-"
    idle: list[str] = []
    pooled: list[str] = []
    sent = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        sender.setblocking(False)
        for entry in entries:
            if entry.name.startswith(mine):
                continue  # this process's own listeners were woken directly
            stem, state = socket_state(entry.name)
            if state is None:  # not pooled: every announcement
                path = Path(entry.path)
                try:
                    mode = entry.stat(follow_symlinks=False).st_mode
                except FileNotFoundError:
                    continue
                if _send(sender, path, path, mode, BROADCAST_BYTE):
                    sent += 1
            else:
                (idle if state == IDLE else pooled).append(stem)
        random.shuffle(idle)  # spread the work over the idle workers
        for stem in idle:
            try:
                os.rename(directory / f"{stem}{IDLE}", directory / f"{stem}{BUSY}")
            except OSError:
                pooled.append(stem)  # another writer took it, or it woke: it is busy now
                continue
            if _send_pooled(sender, directory, stem, TARGETED_BYTE):
                return sent + 1
        for stem in pooled:
            if _send_pooled(sender, directory, stem, BROADCAST_BYTE):
                sent += 1
    return sent


def socket_state(name: str) -> tuple[str, str | None]:
    """A socket file's state-free stem and its pool state (None: not pooled)."""
    for state in (IDLE, BUSY):
        if name.endswith(state):
            return name[: -len(state)], state
    return name.removesuffix(PLAIN), None


def _send_pooled(sender: socket.socket, directory: Path, stem: str, data: bytes) -> bool:
    """Send to a pooled socket under whichever name it has; its listener may rename it
    between idle and busy meanwhile (or to plain), so a name that has just gone is tried
    again."""
    names = [f"{stem}{suffix}" for suffix in (BUSY, IDLE, PLAIN, BUSY, IDLE)]
    for name in names:
        path = directory / name
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        try:
            address = _address(path, directory / f"{stem}{PLAIN}", mode)
            sender.sendto(data, address)
            return True
        except BlockingIOError:
            return True  # its queue is full: it has wake-ups to read already
        except OSError as error:
            if error.errno == errno.ENOENT:
                continue  # renamed between the lstat and the send
            return _failed(path, error)
    return False


def _send(sender: socket.socket, path: Path, stable: Path, mode: int, data: bytes) -> bool:
    try:
        sender.sendto(data, _address(path, stable, mode))
        return True
    except BlockingIOError:
        return True  # its queue is full: it has wake-ups to read already
    except OSError as error:
        return _failed(path, error)


def _address(path: Path, stable: Path, mode: int) -> str | bytes:
    """Where a socket file's listener is bound: the path itself, or for a plain file the
    abstract address of its state-free name."""
    return str(path) if stat.S_ISSOCK(mode) else abstract_address(stable)


def _failed(path: Path, error: OSError) -> bool:
    if error.errno in (errno.ECONNREFUSED, errno.ENOENT):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # its process is gone
    else:
        log.debug("wake-up to %s failed: %s", path, error)
    return False


# -- listening ----------------------------------------------------------------------------


class Wake(enum.Enum):
    """Why a ``Waiter.wait`` returned."""

    TARGETED = "targeted"  # a writer took this idle worker: its task is there, claim at once
    BROADCAST = "broadcast"  # an announcement to every listener (SQLite: read before claiming)
    LOCAL = "local"  # this process: a commit of its own, or a stop
    RECONNECTED = "reconnected"  # the PostgreSQL listener (re)connected: maybe missed some
    TIMEOUT = "timeout"  # nothing arrived: the safety-net poll


# Of several wake-ups before one wait returns, the one that tells the most.
_RANK = {Wake.TIMEOUT: 0, Wake.RECONNECTED: 1, Wake.LOCAL: 2, Wake.BROADCAST: 3, Wake.TARGETED: 4}


class Subscription(Protocol):
    def close(self) -> None: ...


class _Subscription:
    def __init__(
        self, hub: _Hub, channel: str, callback: Callable[[Wake], None], pooled: bool
    ) -> None:
        self.hub = hub
        self.channel = channel
        self.callback = callback
        self.pooled = pooled
        self.waiting = False

    def close(self) -> None:
        self.hub.unsubscribe(self)


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
            hub = _PostgresHub(key, loop, parsed)
        else:
            path = sqlite_path if sqlite_path is not None else (parsed.database or "")
            hub = _SQLiteHub(key, loop, wake_dir(path))
        _hubs[(key, id(loop))] = hub
    return hub.subscribe(channel, callback, pooled)


class _Hub:
    """This process's listening on one database, from one event loop."""

    def __init__(self, key: str, loop: asyncio.AbstractEventLoop) -> None:
        self.key = key
        self.loop = loop
        self.subscriptions: dict[str, list[_Subscription]] = {c: [] for c in CHANNELS}

    def subscribe(
        self, channel: str, callback: Callable[[Wake], None], pooled: bool = False
    ) -> _Subscription:
        subscription = _Subscription(self, channel, callback, pooled)
        first = not self.subscriptions[channel]
        self.subscriptions[channel].append(subscription)
        if first:
            self.open_channel(channel, pooled)
        elif not pooled:
            self.unpool(channel)
        return subscription

    def unsubscribe(self, subscription: _Subscription) -> None:
        listeners = self.subscriptions[subscription.channel]
        with contextlib.suppress(ValueError):
            listeners.remove(subscription)
        if not listeners:
            self.close_channel(subscription.channel)
        elif subscription.waiting:
            self.set_waiting(subscription, False)
        if not any(self.subscriptions.values()):
            self.close()
            if _hubs.get((self.key, id(self.loop))) is self:
                del _hubs[(self.key, id(self.loop))]

    def set_waiting(self, subscription: _Subscription, waiting: bool) -> None:
        """A pooled listener starts or stops waiting: the process is idle while any waits."""
        before = self.waiting(subscription.channel)
        subscription.waiting = waiting
        after = self.waiting(subscription.channel)
        if before != after:
            self.mark(subscription.channel, after)

    def waiting(self, channel: str) -> bool:
        return any(s.waiting for s in self.subscriptions[channel])

    def poke(self, channel: str) -> None:
        """From any thread: run the channel's callbacks on the hub's loop."""
        if not self.subscriptions[channel]:
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed
            self.loop.call_soon_threadsafe(self.deliver, channel, Wake.LOCAL)

    def deliver(self, channel: str, wake: Wake) -> None:
        """Run the channel's callbacks; a targeted wake-up goes to one waiting pooled
        listener only (any other listener that is not pooled hears a broadcast)."""
        listeners = list(self.subscriptions[channel])
        chosen = None
        if wake is Wake.TARGETED:
            chosen = next((s for s in listeners if s.pooled and s.waiting), None)
            if chosen is not None:
                chosen.waiting = False
                # The writer renamed the socket busy; another Waiter may still be waiting.
                self.mark(channel, self.waiting(channel))
                listeners = [s for s in listeners if s is chosen or not s.pooled]
        for subscription in listeners:
            try:
                if wake is Wake.TARGETED and subscription is not chosen:
                    subscription.callback(Wake.BROADCAST)
                else:
                    subscription.callback(wake)
            except Exception:
                log.exception("wake-up listener failed")

    def open_channel(self, channel: str, pooled: bool) -> None: ...

    def unpool(self, channel: str) -> None:
        """A listener that is not one of a pool joined: the channel hears everything."""

    def mark(self, channel: str, idle: bool) -> None: ...

    def close_channel(self, channel: str) -> None: ...

    def close(self) -> None: ...


class _SQLiteHub(_Hub):
    def __init__(self, key: str, loop: asyncio.AbstractEventLoop, directory: Path | None) -> None:
        super().__init__(key, loop)
        self.directory = directory
        # Per channel: the socket, its directory, its state-free stem, and whether pooled.
        self.sockets: dict[str, tuple[socket.socket, Path, str, bool]] = {}

    def open_channel(self, channel: str, pooled: bool) -> None:
        if self.directory is None:
            return  # an in-memory database has no other process to hear from
        try:
            sock, stem = self._bind(self.directory / channel, pooled)
        except OSError as error:
            log.warning("no wake-up socket for %s (%s); polling only", channel, error)
            return
        self.sockets[channel] = (sock, self.directory / channel, stem, pooled)
        self.loop.add_reader(sock.fileno(), self._drain, sock, channel)

    def _bind(self, directory: Path, pooled: bool) -> tuple[socket.socket, str]:
        private_dir(directory)
        stem = f"{os.getpid()}-{secrets.token_hex(4)}"
        # A pooled socket starts busy: it is idle only while a Waiter waits.
        path = directory / (stem + (BUSY if pooled else PLAIN))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            if len(os.fsencode(path)) <= SUN_PATH_MAX:
                sock.bind(str(path))
                os.chmod(path, 0o600)
            else:
                # Named after the stem, which stays the same when the file is renamed.
                sock.bind(abstract_address(directory / f"{stem}{PLAIN}"))
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except BaseException:
            sock.close()
            raise
        return sock, stem

    def _drain(self, sock: socket.socket, channel: str) -> None:
        targeted = broadcast = False
        while True:
            try:
                data = sock.recv(64)
            except OSError:  # BlockingIOError: nothing left
                break
            if data == TARGETED_BYTE:
                targeted = True
            else:
                broadcast = True
        if targeted:
            self.deliver(channel, Wake.TARGETED)
        if broadcast:
            self.deliver(channel, Wake.BROADCAST)

    def mark(self, channel: str, idle: bool) -> None:
        entry = self.sockets.get(channel)
        if entry is None or not entry[3]:
            return
        _, directory, stem, _ = entry
        source, target = (BUSY, IDLE) if idle else (IDLE, BUSY)
        try:
            os.rename(directory / f"{stem}{source}", directory / f"{stem}{target}")
        except FileNotFoundError:
            pass  # busy already: a writer took this socket (only this process makes it idle)
        except OSError as error:
            log.debug("wake-up socket %s not marked: %s", stem, error)

    def unpool(self, channel: str) -> None:
        entry = self.sockets.get(channel)
        if entry is None or not entry[3]:
            return
        sock, directory, stem, _ = entry
        self.sockets[channel] = (sock, directory, stem, False)
        for source in (IDLE, BUSY):  # a writer may rename idle to busy meanwhile
            with contextlib.suppress(FileNotFoundError):
                os.rename(directory / f"{stem}{source}", directory / f"{stem}{PLAIN}")
                return

    def close_channel(self, channel: str) -> None:
        entry = self.sockets.pop(channel, None)
        if entry is None:
            return
        sock, directory, stem, _ = entry
        with contextlib.suppress(Exception):
            self.loop.remove_reader(sock.fileno())
        sock.close()
        for suffix in (PLAIN, IDLE, BUSY):
            with contextlib.suppress(FileNotFoundError):
                (directory / f"{stem}{suffix}").unlink()

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

    def open_channel(self, channel: str, pooled: bool) -> None:
        if self._task is None:
            self._task = self.loop.create_task(self._listen_forever())

    def _on_notify(self, _connection: Any, _pid: int, name: str, payload: str) -> None:
        if payload == str(os.getpid()):
            return  # sent by this process, whose listeners were woken at its commit
        for channel, pg_name in PG_CHANNELS.items():
            if pg_name == name:
                self.deliver(channel, Wake.BROADCAST)

    async def _listen_forever(self) -> None:
        await hold_connection(
            self.dsn,
            self._opened,
            on_lost=self._lost,
            closed=self._closed,
            check_seconds=PG_CHECK_SECONDS,
            base=0.2,
            cap=5.0,
        )

    async def _opened(self, connection: Any) -> None:
        for name in PG_CHANNELS.values():
            await connection.add_listener(name, self._on_notify)
        self._connection = connection
        self.connections += 1
        self.connected.set()
        # Whatever was announced while no connection listened is claimable now.
        for channel in CHANNELS:
            self.deliver(channel, Wake.RECONNECTED)

    def _lost(self, error: Exception) -> None:
        log.warning("wake-up connection to PostgreSQL lost (%s); polling meanwhile", error)

    def _closed(self) -> None:
        self.connected.clear()
        self._connection = None

    def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()


_hubs: dict[tuple[str, int], _Hub] = {}


def hub_for(url: str | URL) -> _Hub | None:
    """This loop's hub for a database (tests look at its connection state)."""
    loop = asyncio.get_running_loop()
    return _hubs.get((database_key(url), id(loop)))
