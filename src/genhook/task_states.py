"""What the task states mean, in one place for the server, the webhook outbox, the SDK and
the CLI, so every consumer agrees on which states end a task (a stream ends, a wait returns,
a poll loop stops). The states themselves are ``genhook.statuses.TaskStatus``.

Dependency-free so the SDK-only install can import it.

created -> processing -> completed | failed | timeout | canceled; processing -> created when
a lease is lost. A terminal state is final.
"""

from __future__ import annotations

from genhook.statuses import TaskStatus

# Not yet ended: cancelable, counted as in flight.
ACTIVE: tuple[TaskStatus, ...] = (TaskStatus.CREATED, TaskStatus.PROCESSING)
TERMINAL: tuple[TaskStatus, ...] = (
    TaskStatus.COMPLETED,
    TaskStatus.FAILED,
    TaskStatus.TIMEOUT,
    TaskStatus.CANCELED,
)
# Terminal without a result: the callback says ``ERROR`` and carries an ``error`` text.
UNSUCCESSFUL: tuple[TaskStatus, ...] = (TaskStatus.FAILED, TaskStatus.TIMEOUT, TaskStatus.CANCELED)

CANCELED_MESSAGE = "The task was canceled."
# What a timed-out task says, in polling and in its callback alike.
TIMEOUT_MESSAGE = "The task did not finish before its deadline."
NOT_STARTED_MESSAGE = "The task did not start before its start deadline (X-Start-Deadline)."

TERMINAL_STATUSES: frozenset[str] = frozenset(TERMINAL)
ACTIVE_STATUSES: frozenset[str] = frozenset(ACTIVE)

# What ``status`` in a result may be, mapped to the stored states it covers: polling shows
# ``timeout`` as ``failed``.
POLLED_STATUSES: dict[str, tuple[TaskStatus, ...]] = {
    TaskStatus.CREATED: (TaskStatus.CREATED,),
    TaskStatus.PROCESSING: (TaskStatus.PROCESSING,),
    TaskStatus.COMPLETED: (TaskStatus.COMPLETED,),
    TaskStatus.FAILED: (TaskStatus.FAILED, TaskStatus.TIMEOUT),
    TaskStatus.CANCELED: (TaskStatus.CANCELED,),
}


def is_terminal(status: str) -> bool:
    return status in TERMINAL_STATUSES


def polled_status(status: str) -> str:
    """The status polling shows for a stored one."""
    for polled, stored in POLLED_STATUSES.items():
        if status in stored:
            return polled
    return status
