"""The wake-ups adapter for SQLite, whose processes share one machine: local sockets.

A Unix datagram socket per listening process and channel under
``<database directory>/wake/<channel>/`` (0700). A path longer than ``sun_path`` allows is
bound in Linux's abstract namespace under a hash of its state-free name
(``<pid>-<token>.sock``), with a plain file at the path so writers still find it.

A worker's socket (a ``Waiter``, one of a pool that any member can serve) is named
``<pid>-<token>.idle.sock`` while one of its process's Waiters waits and
``<pid>-<token>.busy.sock`` otherwise; every other socket is ``<pid>-<token>.sock`` and gets
every announcement. After commit the writer sends ``!`` (for everyone) to each plain socket,
then takes one idle socket by renaming it to its busy name and sends it ``1`` (for it
alone): ``rename`` is atomic, so of two writers racing for one idle worker exactly one wins,
and the other takes the next idle one. That worker claims at once, without reading first.
Only when no idle socket can be taken does the writer send ``!`` to every pooled one.
Sockets nobody is bound to any more (``ECONNREFUSED``, ``ENOENT``) are removed.

No announcement is lost while its workers live, because a worker marks itself idle
(renames busy to idle) before it waits, never after, and claims again after a task when a
wake-up arrived meanwhile (``Waiter.pending``):

- A writer that took an idle socket sent to a worker that was waiting then. If its wait ended
  meanwhile (the poll), the datagram is still queued and counts as a pending wake-up.
- A writer that found no idle socket sent to every busy one, including a worker that went
  idle just after the writer looked (a send that meets the other name follows the rename).
  The datagram waits in the socket's queue, so the wait that follows returns at once.
- A worker that looked (read or claimed) before a commit and found nothing is, at that
  writer's scan either still busy (the writer then took another, idle worker, or sent to
  every busy one) or already idle (and may be the one taken). Datagrams read together
  before one claim make one wake-up, but each belongs to a commit that claim sees, and the
  claim reports whether a second task waited (``Claim.more`` of ``Lifecycle.claim``), so the worker
  claims again after its task.

Only a worker killed just after a writer took it drops a wake-up; its task waits for another
worker's poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import hashlib
import logging
import os
import random
import secrets
import socket
import stat
from pathlib import Path

from genhook.db.wakeups.port import Hub, Wake
from genhook.files import private_dir

log = logging.getLogger("genhook.db.wakeups")

# The longest socket path ``bind`` takes on Linux (``sun_path`` less its terminating NUL).
SUN_PATH_MAX = 107

# Socket names on SQLite: a pooled listener's, by state, and everyone else's.
IDLE = ".idle.sock"
BUSY = ".busy.sock"
PLAIN = ".sock"
# What a datagram says: there is work, for everyone; or for the one socket it was sent to.
BROADCAST_BYTE = b"!"
TARGETED_BYTE = b"1"


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


class SocketsHub(Hub):
    """Listening on local datagram sockets, one per channel."""

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
