"""Pooled wake-up sockets on SQLite: a writer takes one idle worker by renaming its socket and
wakes it alone, wakes every busy one when none is idle, and still wakes every plain socket;
a worker taken alone claims without reading first."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from genhook.db import Database, Task, wakeups
from genhook.db.wakeups import Waiter, Wake, sockets
from genhook.db.wakeups.postgres import PostgresHub
from tests.conftest import QUIET_KEEPER, Harness, make_harness, make_settings
from tests.integration.test_hot_path import counting, submit
from tests.support.settled import settled

# A worker that does nothing unasked while a count runs: no poll, no heartbeat, no check.
QUIET = {"worker_poll_seconds": 30.0, **QUIET_KEEPER}

WRITER = (
    "import sys; from pathlib import Path; from genhook.db.wakeups import send_wakeups; "
    "print(send_wakeups(Path(sys.argv[1])))"
)


def send_from_another_process(directory: Path) -> int:
    """A writer's wake-ups after its commit, from a process of its own (a writer skips its
    own process's sockets)."""
    sent = subprocess.run(
        [sys.executable, "-c", WRITER, str(directory)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return int(sent.stdout.strip())


class Listeners:
    """Datagram sockets bound under names of other processes, as their hubs bind them."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.sockets: dict[str, socket.socket] = {}

    def bind(self, name: str) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        sock.bind(str(self.directory / name))
        self.sockets[name] = sock
        return sock

    def received(self, name: str) -> list[bytes]:
        got: list[bytes] = []
        while True:
            try:
                got.append(self.sockets[name].recv(8))
            except BlockingIOError:
                return got

    def names(self) -> list[str]:
        return sorted(path.name for path in self.directory.iterdir())

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close()


@pytest.fixture
def short_path() -> Iterator[Path]:
    """A directory whose wake-up sockets fit ``sun_path`` however deep pytest's own
    temporary directories are."""
    path = Path(tempfile.mkdtemp(prefix="gh-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def listeners(tmp_path: Path) -> Iterator[Listeners]:
    directory = tmp_path / "wake" / "tasks"
    directory.mkdir(parents=True)
    pool = Listeners(directory)
    yield pool
    pool.close()


def test_one_of_two_idle_listeners_is_woken_alone_and_busy_ones_all(
    listeners: Listeners,
) -> None:
    listeners.bind("1-a.idle.sock")
    listeners.bind("2-b.idle.sock")
    assert wakeups.send_wakeups(listeners.directory) == 1
    # The bound sockets, under any name.
    got = {stem: listeners.received(f"{stem}.idle.sock") for stem in ("1-a", "2-b")}
    (first,) = [stem for stem, data in got.items() if data == [b"1"]]
    other = "2-b" if first == "1-a" else "1-a"
    assert got[other] == []
    assert listeners.names() == sorted([f"{first}.busy.sock", f"{other}.idle.sock"])
    # The next commit takes the other idle one.
    assert wakeups.send_wakeups(listeners.directory) == 1
    assert listeners.received(f"{other}.idle.sock") == [b"1"]
    assert listeners.received(f"{first}.idle.sock") == []
    assert listeners.names() == ["1-a.busy.sock", "2-b.busy.sock"]
    # Both busy: both hear it, so the one that finishes first claims the task.
    assert wakeups.send_wakeups(listeners.directory) == 2
    assert listeners.received("1-a.idle.sock") == [b"!"]
    assert listeners.received("2-b.idle.sock") == [b"!"]


def test_plain_sockets_hear_every_wakeup(listeners: Listeners) -> None:
    listeners.bind("1-plain.sock")
    listeners.bind("2-pooled.idle.sock")
    assert wakeups.send_wakeups(listeners.directory) == 2
    assert wakeups.send_wakeups(listeners.directory) == 2
    assert listeners.received("1-plain.sock") == [b"!", b"!"]
    assert listeners.received("2-pooled.idle.sock") == [b"1", b"!"]
    assert listeners.names() == ["1-plain.sock", "2-pooled.busy.sock"]


def test_a_stale_idle_socket_is_removed_and_the_next_idle_one_woken(
    listeners: Listeners, monkeypatch: pytest.MonkeyPatch
) -> None:
    listeners.bind("1-dead.idle.sock").close()  # its process is gone; the file stays behind
    (listeners.directory / "2-abstract.idle.sock").touch()  # an abstract listener, gone too
    listeners.bind("3-live.idle.sock")
    # The writer picks idle sockets in random order; here the dead ones come first.
    monkeypatch.setattr(random, "shuffle", lambda stems: stems.sort())
    assert wakeups.send_wakeups(listeners.directory) == 1
    assert listeners.received("3-live.idle.sock") == [b"1"]
    assert listeners.names() == ["3-live.busy.sock"]


def test_a_listener_that_goes_idle_after_the_writer_looked_still_hears_it(
    listeners: Listeners, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer saw it busy (so found nobody idle); the listener then renamed its socket
    idle and waits. The send follows the rename."""
    listeners.bind("1-a.busy.sock")
    directory = listeners.directory
    send = sockets._send_pooled

    def goes_idle_first(sender: socket.socket, where: Path, stem: str, data: bytes) -> bool:
        os.rename(where / f"{stem}.busy.sock", where / f"{stem}.idle.sock")
        return send(sender, where, stem, data)

    monkeypatch.setattr(sockets, "_send_pooled", goes_idle_first)
    assert wakeups.send_wakeups(directory) == 1
    assert listeners.received("1-a.busy.sock") == [b"!"]
    assert listeners.names() == ["1-a.idle.sock"]


def _wake_files(directory: Path) -> list[str]:
    return sorted(path.name.split(".", 1)[1] for path in directory.iterdir())


async def _waiting(waiter: Waiter, timeout: float = 30.0) -> asyncio.Task[Wake]:
    waiting = asyncio.create_task(waiter.wait(timeout))
    await asyncio.sleep(0)  # it marks the socket idle before it blocks
    return waiting


@pytest.mark.parametrize("deep", [False, True], ids=["path", "abstract"])
async def test_a_waiter_is_idle_while_it_waits_and_hears_how_it_was_woken(
    short_path: Path, deep: bool
) -> None:
    """Idle while waiting, busy otherwise; woken alone when idle, by a broadcast when busy
    (a wake-up that came while busy ends the next wait at once). Also under a path too long
    for ``sun_path`` (the abstract namespace, named after the state-free stem)."""
    base = short_path.joinpath(*["a-rather-long-directory-name"] * 4) if deep else short_path
    base.mkdir(parents=True, exist_ok=True)
    database = str(base / "genhook.db")
    directory = base / "wake" / "tasks"
    waiter = Waiter()
    waiter.attach(f"sqlite+aiosqlite:///{database}", wakeups.TASKS, database)
    try:
        (entry,) = directory.iterdir()
        assert (len(os.fsencode(entry)) > wakeups.SUN_PATH_MAX) is deep
        assert _wake_files(directory) == ["busy.sock"]
        waiting = await _waiting(waiter)
        assert _wake_files(directory) == ["idle.sock"]
        assert send_from_another_process(directory) == 1
        assert await asyncio.wait_for(waiting, 30) is Wake.TARGETED
        assert _wake_files(directory) == ["busy.sock"]
        # Busy: the writer finds no idle socket and sends to every busy one.
        assert send_from_another_process(directory) == 1
        async with asyncio.timeout(30):
            while not waiter.pending():
                await asyncio.sleep(0.01)
        assert await waiter.wait(30) is Wake.BROADCAST
        assert await waiter.wait(0.05) is Wake.TIMEOUT
        assert _wake_files(directory) == ["busy.sock"]
        waiter.set()
        assert await waiter.wait(30) is Wake.LOCAL
    finally:
        waiter.close()
    assert not list(directory.iterdir())


async def test_waiters_of_one_process_share_a_socket_idle_while_any_waits(
    tmp_path: Path,
) -> None:
    """A datagram for the process alone wakes one of its waiting Waiters; the socket is idle
    again for the others."""
    database = str(tmp_path / "genhook.db")
    directory = tmp_path / "wake" / "tasks"
    url = f"sqlite+aiosqlite:///{database}"
    first, second = Waiter(), Waiter()
    first.attach(url, wakeups.TASKS, database)
    second.attach(url, wakeups.TASKS, database)
    try:
        waits = [await _waiting(first), await _waiting(second)]
        assert _wake_files(directory) == ["idle.sock"]
        assert send_from_another_process(directory) == 1
        done, pending = await asyncio.wait(waits, timeout=30, return_when="FIRST_COMPLETED")
        assert [task.result() for task in done] == [Wake.TARGETED]
        await asyncio.sleep(0.2)  # time for a wrong wake of the other one to show
        assert len(pending) == 1 and not pending.pop().done()
        assert _wake_files(directory) == ["idle.sock"]
        assert send_from_another_process(directory) == 1
        results = await asyncio.wait_for(asyncio.gather(*waits), 30)
        assert sorted(wake.value for wake in results) == ["targeted", "targeted"]
        assert _wake_files(directory) == ["busy.sock"]
    finally:
        first.close()
        second.close()


async def test_a_worker_taken_alone_claims_without_reading_first(
    short_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Woken alone, the worker's first transaction is the claim; woken by a broadcast it
    reads first (an idle worker's poll writes nothing)."""
    sqlite_url = f"sqlite+aiosqlite:///{short_path / 'genhook.db'}"
    h = await make_harness(make_settings(short_path, sqlite_url, **QUIET))
    observer = Database(sqlite_url)  # its reads are not counted
    directory = short_path / "wake" / "tasks"
    # The submits below come from "another process": only the socket wakes the worker.
    monkeypatch.setattr(wakeups, "announce", lambda *args, **kwargs: None)
    stop = asyncio.Event()
    running = asyncio.create_task(h.worker.run(stop))

    async def idle() -> None:
        async with asyncio.timeout(30):
            while not directory.is_dir() or _wake_files(directory) != ["idle.sock"]:
                await asyncio.sleep(0.01)

    try:
        await idle()
        targeted = await submit(h)
        with counting(h.state.db) as seen:
            assert send_from_another_process(directory) == 1
            await completed(observer, targeted)
            await idle()
        assert seen["tx"] == 2, dict(seen)  # the claim and the completion, no read first

        broadcast = await submit(h)
        (entry,) = directory.iterdir()
        with counting(h.state.db) as seen:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
                sender.sendto(b"!", str(entry))
            await completed(observer, broadcast)
            await idle()
        assert seen["tx"] == 3, dict(seen)  # the read, the claim, the completion
    finally:
        await shut(stop, running, observer, h)


@pytest.mark.postgres
async def test_a_worker_woken_by_notify_claims_without_reading_first(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL a claim that finds nothing writes and locks nothing (SKIP LOCKED), so a
    worker woken by NOTIFY claims at once; the poll still reads first."""
    import asyncpg

    h = await make_harness(make_settings(tmp_path, pg_url, **QUIET))
    observer = Database(pg_url)
    # The submit comes from "another process": only its NOTIFY wakes the worker.
    monkeypatch.setattr(wakeups, "announce", lambda *args, **kwargs: None)
    monkeypatch.setattr(wakeups, "notify", _no_notify)
    stop = asyncio.Event()
    running = asyncio.create_task(h.worker.run(stop))
    dsn = pg_url.replace("postgresql+asyncpg://", "postgresql://")
    try:
        async with asyncio.timeout(30):
            loop = asyncio.get_running_loop()
            while not (hubs := [x for x in wakeups._hubs.values() if x.loop is loop]):
                await asyncio.sleep(0.01)
            (hub,) = hubs
            assert isinstance(hub, PostgresHub)
        await settled(h.worker)
        task_id = await submit(h)
        with counting(h.state.db) as seen:
            other = await asyncpg.connect(dsn)
            try:
                await other.execute("SELECT pg_notify('genhook_tasks', 'another process')")
            finally:
                await other.close()
            await completed(observer, task_id)
        assert seen["tx"] == 2, dict(seen)  # the claim and the completion, no read first
    finally:
        await shut(stop, running, observer, h)


async def completed(observer: Database, task_id: str) -> None:
    async with asyncio.timeout(30):
        while True:
            async with observer.read() as session:
                status = await session.scalar(select(Task.status).where(Task.id == task_id))
            if status == "completed":
                return
            await asyncio.sleep(0.02)


async def shut(
    stop: asyncio.Event, running: asyncio.Task[None], observer: Database, h: Harness
) -> None:
    stop.set()
    await running
    await observer.dispose()
    await h.client.aclose()
    await h.state.db.dispose()


async def _no_notify(*args: object, **kwargs: object) -> None:
    """Submits without announcing: the test sends the NOTIFY itself."""
