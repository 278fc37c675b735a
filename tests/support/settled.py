"""Waiting for a running worker to settle, for tests that count what it does next."""

from __future__ import annotations

import asyncio

from genhook.db import wakeups
from genhook.db.wakeups import TASKS
from genhook.tasks.worker import Worker


async def settled(worker: Worker, timeout: float = 30.0) -> None:
    """Until the worker waits with no wake-up pending and, on PostgreSQL, listens.

    Its LISTEN connection comes up after the worker started, and announces itself with a
    wake-up (``Wake.RECONNECTED``) worth a read or a claim; that work belongs to the start,
    and a count begun before it would see it.
    """
    async with asyncio.timeout(timeout):
        while True:
            hub = wakeups.hub_for(worker.db.url)
            listening = getattr(hub, "connected", None)  # PostgreSQL's LISTEN connection
            connected = listening is None or listening.is_set()
            # Once connected, its wake-up was delivered at once: still pending, or consumed
            # by the wait that returned, after which the worker waits again.
            if hub is not None and connected and hub.waiting(TASKS) and not worker.wakeup.pending():
                return
            await asyncio.sleep(0.01)
