"""Group commit of task completions, for I/O-bound engines with many tasks in flight.

Completions that arrive while a transaction is being written join the next one, so under
load one commit ends many tasks instead of one each. A batch that fails is retried task by
task, so one bad row never fails its neighbours.
"""

from __future__ import annotations

import asyncio
import logging

from genhook.tasks.lifecycle import Completion, Lifecycle

log = logging.getLogger(__name__)


class GroupCompleter:
    def __init__(self, lifecycle: Lifecycle, worker_id: str, max_batch: int = 64) -> None:
        self.lifecycle = lifecycle
        self.worker_id = worker_id
        self.max_batch = max_batch
        self._pending: list[tuple[Completion, asyncio.Future[bool]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def complete(self, item: Completion) -> bool:
        """True when the task ended as completed; False when it was no longer ours."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return await asyncio.shield(future)

    async def _flush(self) -> None:
        while self._pending:
            batch = self._pending[: self.max_batch]
            del self._pending[: self.max_batch]
            try:
                results = await self.lifecycle.complete_many(
                    self.worker_id, [item for item, _ in batch]
                )
            except Exception:
                if len(batch) > 1:
                    log.warning("a group of %d completions failed; one by one", len(batch))
                for item, future in batch:
                    try:
                        (result,) = await self.lifecycle.complete_many(self.worker_id, [item])
                    except Exception as exc:
                        if not future.done():
                            future.set_exception(exc)
                    else:
                        if not future.done():
                            future.set_result(result)
                continue
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)
