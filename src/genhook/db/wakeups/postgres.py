"""The wake-ups adapter for PostgreSQL: ``LISTEN``/``NOTIFY``.

A writer runs ``pg_notify`` in its transaction (PostgreSQL delivers it at commit); each
process and event loop keeps one dedicated asyncpg connection that ``LISTEN``s on both
channels, reconnected with the shared backoff after a database restart. Every listener
hears every announcement, except the sending process's own, which were woken at commit.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import URL

from genhook.db.held_connection import hold_connection
from genhook.db.wakeups.port import CHANNELS, Hub, Wake

log = logging.getLogger("genhook.db.wakeups")

# PostgreSQL channel names, shared by every process on the database.
PG_CHANNELS = {channel: f"genhook_{channel}" for channel in CHANNELS}
# How often an idle LISTEN connection is checked with a query (a read, never a write).
PG_CHECK_SECONDS = 30.0


PG_NOTIFY = text("SELECT pg_notify(:channel, :sender)")


def pg_notify_params(channel: str) -> dict[str, str]:
    """``PG_NOTIFY``'s parameters for ``channel``: the payload names this process, whose own
    listeners ``announce`` wakes at commit."""
    return {"channel": PG_CHANNELS[channel], "sender": str(os.getpid())}


class PostgresHub(Hub):
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
