"""The outbox port: what the task domain tells the webhook side, in the transaction that
changes the task.

``tasks/`` decides when an event happens and what it carries (a terminal event carries the
prediction response polling shows); ``genhook.sender`` implements ``Outbox`` and decides
what it becomes (a signed delivery row, superseded progress events, a wake-up of the
dispatchers). ``genhook.sender`` never imports ``tasks/``: its implementation is checked
against this protocol structurally, where the two are wired together (``genhook.wiring``).
Each call adds to the caller's transaction, so an event commits with its transition or not
at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from sqlalchemy import ColumnElement, Select

from genhook.config import Settings
from genhook.db import Database, Task
from genhook.db.driver import Tx
from genhook.storage import BlobStore
from genhook.tasks.views import prediction_view


@dataclass(frozen=True, slots=True)
class TaskStarted:
    """A worker claimed ``task`` (in the claim's transaction)."""

    task: Task
    now: int


@dataclass(frozen=True, slots=True)
class TaskEnded:
    """``task`` reached a terminal state; ``payload`` is its prediction response."""

    task: Task
    payload: Mapping[str, Any]
    now: int


@dataclass(frozen=True, slots=True)
class TasksDeleted:
    """Retention deleted these finished tasks: their webhook history goes with them."""

    task_ids: Sequence[str]


_Query = TypeVar("_Query", bound=Select[Any])


class Outbox(Protocol):
    async def task_started(self, tx: Tx, event: TaskStarted) -> None: ...

    async def task_ended(self, tx: Tx, event: TaskEnded) -> None: ...

    async def tasks_deleted(self, tx: Tx, event: TasksDeleted) -> None: ...

    async def prune_attempts(self, db: Database, before: int, batch: int, max_batches: int) -> int:
        """Delete delivery attempts started before ``before``, ``batch`` per transaction and
        at most ``max_batches`` transactions; returns how many went."""
        ...

    def without_terminal_event(self, query: _Query, task_id: ColumnElement[str]) -> _Query:
        """``query`` (over tasks, ``task_id`` its id column) kept to the tasks without a
        terminal event in the outbox: the reconciler's tasks, in its one statement."""
        ...

    def pending_event(self, task_id: ColumnElement[str]) -> ColumnElement[bool]:
        """Whether the task ``task_id`` names has an event still to deliver: a condition for
        a statement on tasks (retention keeps such a task)."""
        ...


def webhook_outbox() -> Outbox:
    """The service's outbox: webhook deliveries (``genhook.sender``), the default of every
    part of ``tasks/`` that publishes (``genhook.wiring`` passes it explicitly)."""
    from genhook.sender.outbox import WebhookOutbox

    return WebhookOutbox()


async def publish_ended(
    outbox: Outbox, tx: Tx, task: Task, settings: Settings, storage: BlobStore, now: int
) -> None:
    """``TaskEnded`` for a task with a webhook, with the payload polling shows."""
    if not task.webhook_url:
        return
    payload = await prediction_view(task, settings, storage, for_webhook=True)
    await outbox.task_ended(tx, TaskEnded(task, payload, now))
