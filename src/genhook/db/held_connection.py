"""A PostgreSQL connection of a process's own, outside the pool, held for as long as the
process wants it: the wake-up ``LISTEN`` connection (``genhook.db.wakeups``) and a standalone
worker's liveness lock (``genhook.tasks.liveness``). After a restart drops it, it is opened
again with the shared backoff; while idle it is checked with ``SELECT 1``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from genhook.retry import backoff_delay


async def hold_connection(
    dsn: str,
    opened: Callable[[Any], Awaitable[None]],
    *,
    on_lost: Callable[[Exception], None],
    closed: Callable[[], None] = lambda: None,
    check_seconds: float,
    base: float,
    cap: float,
) -> None:
    """Keep a connection to ``dsn`` open until cancelled. ``opened`` sets up each new one
    (listeners, locks); ``on_lost`` hears why one was lost; ``closed`` runs after each."""
    import asyncpg

    failures = 0
    while True:
        lost = asyncio.Event()
        connection: Any = None
        try:
            connection = await asyncpg.connect(dsn, timeout=10)
            connection.add_termination_listener(partial(_set_when_closed, lost))
            await opened(connection)
            failures = 0
            while not lost.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(lost.wait(), check_seconds)
                if not lost.is_set():
                    await asyncio.wait_for(connection.fetchval("SELECT 1"), 10)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            on_lost(error)
        finally:
            closed()
            if connection is not None:
                connection.terminate()
        failures += 1
        await asyncio.sleep(backoff_delay(failures, base, cap))


def _set_when_closed(lost: asyncio.Event, _connection: Any) -> None:
    lost.set()
