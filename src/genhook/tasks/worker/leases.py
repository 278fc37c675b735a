"""Lease heartbeats and cancel checks for every task one worker process holds, batched.

A worker with 64 upstream tasks in flight would otherwise run two timers and two statements
per task: a heartbeat every third of the lease and a cancel check every
``cancel_check_seconds``. Here one loop per process extends every held lease in one UPDATE
and checks every held task in one indexed read, at the same intervals, so a cancel is still
noticed within ``cancel_check_seconds`` and a lease never goes a third of its length without
a heartbeat. A task whose row is no longer ``processing`` under this worker has its ``lost``
event set, exactly as the per-task heartbeat did.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from genhook.tasks.lifecycle import Lifecycle

log = logging.getLogger(__name__)


class LeaseKeeper:
    def __init__(
        self, lifecycle: Lifecycle, worker_id: str, heartbeat_seconds: float, check_seconds: float
    ) -> None:
        self.lifecycle = lifecycle
        self.worker_id = worker_id
        self.heartbeat_seconds = heartbeat_seconds
        self.check_seconds = check_seconds
        self._held: dict[str, asyncio.Event] = {}
        self._runner: asyncio.Task[None] | None = None

    def hold(self, task_id: str, lost: asyncio.Event) -> None:
        """Keep ``task_id``'s lease alive until ``drop``; ``lost`` is set if it is lost."""
        self._held[task_id] = lost
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run())

    def held(self) -> frozenset[str]:
        """The tasks whose leases this keeper holds now."""
        return frozenset(self._held)

    def drop(self, task_id: str) -> None:
        self._held.pop(task_id, None)
        if not self._held and self._runner is not None:
            self._runner.cancel()
            self._runner = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_beat = loop.time() + self.heartbeat_seconds
        next_check = loop.time() + self.check_seconds
        while self._held:
            await asyncio.sleep(max(0.0, min(next_beat, next_check) - loop.time()))
            ids = list(self._held)
            if not ids:
                continue
            try:
                if loop.time() >= next_beat:
                    next_beat = loop.time() + self.heartbeat_seconds
                    next_check = loop.time() + self.check_seconds  # a heartbeat is a check too
                    kept = await self.lifecycle.heartbeat_many(ids, self.worker_id)
                else:
                    next_check = loop.time() + self.check_seconds
                    kept = await self.lifecycle.held_of(ids, self.worker_id)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("worker %s: heartbeat or cancel check failed", self.worker_id)
                continue
            for task_id in ids:
                if task_id not in kept:
                    with contextlib.suppress(KeyError):
                        self._held.pop(task_id).set()
