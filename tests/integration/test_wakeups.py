"""genhook.db.wakeups: announcements at commit (never on rollback), scheduled retries without
polling, stale and long socket paths, and the PostgreSQL listener's reconnect."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import text

from genhook.db import Database, wakeups
from genhook.db.wakeups.postgres import PostgresHub
from genhook.wiring import webhook_service
from tests.support.webhook_receiver import (
    Receiver,
    add_account,
    create_schema,
    enqueue,
    sequence,
    terminal_task,
    webhook_settings,
)


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    db = Database(database_url)
    await create_schema(db)
    yield db
    await db.dispose()


async def _wait(event: asyncio.Event, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        await event.wait()


async def test_a_commit_wakes_listeners_and_a_rollback_does_not(database: Database) -> None:
    woken = {channel: asyncio.Event() for channel in wakeups.CHANNELS}
    subscriptions = [
        wakeups.subscribe(database.url, channel, woken[channel].set, database.sqlite_path)
        for channel in wakeups.CHANNELS
    ]
    try:
        hub = wakeups.hub_for(database.url)
        if database.is_postgres:
            assert isinstance(hub, PostgresHub)
            await _wait(hub.connected)
            await asyncio.sleep(0.2)
        for event in woken.values():
            event.clear()  # a fresh LISTEN connection wakes everyone once
        with pytest.raises(RuntimeError):
            async with database.write() as session:
                await wakeups.notify(session, wakeups.TASKS)
                raise RuntimeError("rolled back")
        await asyncio.sleep(0.3)
        assert not woken[wakeups.TASKS].is_set()
        async with database.write() as session:
            await session.execute(text("SELECT 1"))
            await wakeups.notify(session, wakeups.TASKS)
            await wakeups.notify(session, wakeups.TASKS)  # once per transaction
            await asyncio.sleep(0.2)
            assert not woken[wakeups.TASKS].is_set()  # not before the commit
        await _wait(woken[wakeups.TASKS])
        assert not woken[wakeups.DELIVERIES].is_set()
    finally:
        for subscription in subscriptions:
            subscription.close()


async def test_a_scheduled_retry_is_sent_when_due_without_polling(
    tmp_path: Path, database_url: str, database: Database
) -> None:
    """With a 30 s safety poll, the dispatcher still sends the retry of a failed attempt
    when its ``next_attempt_at`` comes (it reads the earliest due time, it does not poll)."""
    settings = webhook_settings(
        tmp_path, database_url, webhook_poll_seconds=30.0, webhook_retry_base_seconds=0.5
    )
    receiver = await Receiver(sequence(500, 200)).start()
    await add_account(database)
    service = webhook_service(settings, database)
    stop = asyncio.Event()
    run = asyncio.create_task(service.run(stop))
    try:
        await asyncio.sleep(1.0)  # the dispatcher's first claim has come back empty
        await enqueue(database, terminal_task("t1", f"http://127.0.0.1:{receiver.port}/hook"))
        await receiver.wait_for(2, timeout=6.0)
        assert len(receiver.received) == 2
    finally:
        stop.set()
        await run
        await receiver.stop()


def test_stale_sockets_are_removed_and_live_ones_woken(tmp_path: Path) -> None:
    directory = tmp_path / "wake" / "tasks"
    directory.mkdir(parents=True)
    live = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    live.bind(str(directory / "1-live.sock"))
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(directory / "2-dead.sock"))
    dead.close()  # its process is gone; the file stays behind
    (directory / "3-abstract.sock").touch()  # an abstract-namespace listener, gone too
    try:
        assert wakeups.send_wakeups(directory) == 1
        assert live.recv(8) == b"!"
        assert sorted(p.name for p in directory.iterdir()) == ["1-live.sock"]
    finally:
        live.close()


async def test_a_socket_path_too_long_for_sun_path_still_wakes(tmp_path: Path) -> None:
    """Sockets under a deep data directory are bound in the abstract namespace, and a
    writer in another process still finds them."""
    deep = tmp_path.joinpath(*["a-rather-long-directory-name"] * 4)
    deep.mkdir(parents=True)
    database = str(deep / "genhook.db")
    woken = asyncio.Event()
    subscription = wakeups.subscribe(
        f"sqlite+aiosqlite:///{database}", wakeups.TASKS, woken.set, database
    )
    try:
        (entry,) = (deep / "wake" / "tasks").iterdir()
        assert len(os.fsencode(entry)) > wakeups.SUN_PATH_MAX
        assert entry.stat().st_mode & 0o777 == 0o600
        script = (
            "import sys; from pathlib import Path; "
            "from genhook.db.wakeups import send_wakeups; "
            "print(send_wakeups(Path(sys.argv[1])))"
        )
        sent = subprocess.run(
            [sys.executable, "-c", script, str(deep / "wake" / "tasks")],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert sent == "1"
        await _wait(woken)
    finally:
        subscription.close()
    assert not list((deep / "wake" / "tasks").iterdir())


@pytest.mark.postgres
async def test_the_postgres_listener_reconnects(pg_url: str) -> None:
    db = Database(pg_url)
    woken = asyncio.Event()
    subscription = wakeups.subscribe(db.url, wakeups.DELIVERIES, woken.set)
    try:
        hub = wakeups.hub_for(db.url)
        assert isinstance(hub, PostgresHub)
        await _wait(hub.connected, 10)
        first = hub.connections
        # The database drops the listening connection (as a restart would).
        async with db.write() as session:
            await session.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND query LIKE 'LISTEN%'"
                )
            )
        async with asyncio.timeout(15):
            while hub.connections == first or not hub.connected.is_set():
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        woken.clear()
        # As another process's commit arrives: through PostgreSQL alone, no in-process path.
        async with db.write() as session:
            await session.execute(text("SELECT pg_notify('genhook_deliveries', '')"))
        await _wait(woken)
    finally:
        subscription.close()
        await db.dispose()
