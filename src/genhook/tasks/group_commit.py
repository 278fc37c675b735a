"""Group commit: items from concurrent callers written in shared transactions.

Items that arrive while a transaction is being written join the next one, so under load one
commit serves many callers instead of one each; each caller waits for the transaction that
holds its item, so what it returns is durable. A group that fails is retried item by item,
so one bad row never fails its neighbours. Submission inserts its task rows this way
(``GroupInserter``) and the worker records the completions of I/O-bound tasks this way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

Item = TypeVar("Item")
Result = TypeVar("Result")


class GroupCommit(Generic[Item, Result]):
    """``write(items)`` writes one group in one transaction and returns one result per item."""

    def __init__(
        self, write: Callable[[list[Item]], Awaitable[Sequence[Result]]], max_batch: int
    ) -> None:
        self._write = write
        self.max_batch = max_batch
        self._pending: list[tuple[Item, asyncio.Future[Result]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def submit(self, item: Item) -> Result:
        """``item``'s result, once the transaction holding it has committed."""
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return await asyncio.shield(future)

    async def _flush(self) -> None:
        while self._pending:
            group = self._pending[: self.max_batch]
            del self._pending[: self.max_batch]
            try:
                results = await self._write([item for item, _ in group])
            except Exception as error:
                if len(group) == 1:
                    _reject(group[0][1], error)
                    continue
                log.warning("a group of %d writes failed (%s); one by one", len(group), error)
                for item, future in group:
                    try:
                        (result,) = await self._write([item])
                    except Exception as exc:
                        _reject(future, exc)
                    else:
                        _resolve(future, result)
                continue
            for (_, future), result in zip(group, results, strict=True):
                _resolve(future, result)


def _resolve(future: asyncio.Future[Result], result: Result) -> None:
    if not future.done():
        future.set_result(result)


def _reject(future: asyncio.Future[Result], error: Exception) -> None:
    if not future.done():
        future.set_exception(error)
