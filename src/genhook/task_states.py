"""Task states, in one place for the server, the webhook outbox, the SDK and the CLI, so
every consumer agrees on which states end a task (a stream ends, a wait returns, a poll
loop stops).

Dependency-free so the SDK-only install can import it.

created -> processing -> completed | failed | timeout | canceled; processing -> created when
a lease is lost. A terminal state is final.
"""

from __future__ import annotations

CREATED = "created"
PROCESSING = "processing"
COMPLETED = "completed"
FAILED = "failed"
TIMEOUT = "timeout"
CANCELED = "canceled"

# Not yet ended: cancelable, counted as in flight.
ACTIVE: tuple[str, ...] = (CREATED, PROCESSING)
TERMINAL: tuple[str, ...] = (COMPLETED, FAILED, TIMEOUT, CANCELED)
# Terminal without a result: the callback says ``ERROR`` and carries an ``error`` text.
UNSUCCESSFUL: tuple[str, ...] = (FAILED, TIMEOUT, CANCELED)

CANCELED_MESSAGE = "The task was canceled."
# What a timed-out task says, in polling and in its callback alike.
TIMEOUT_MESSAGE = "The task did not finish before its deadline."
NOT_STARTED_MESSAGE = "The task did not start before its start deadline (X-Start-Deadline)."

TERMINAL_STATUSES = frozenset(TERMINAL)
ACTIVE_STATUSES = frozenset(ACTIVE)

# What ``status`` in a result may be, mapped to the stored states it covers: polling shows
# ``timeout`` as ``failed``.
POLLED_STATUSES: dict[str, tuple[str, ...]] = {
    CREATED: (CREATED,),
    PROCESSING: (PROCESSING,),
    COMPLETED: (COMPLETED,),
    FAILED: (FAILED, TIMEOUT),
    CANCELED: (CANCELED,),
}


def is_terminal(status: str) -> bool:
    return status in TERMINAL_STATUSES


def polled_status(status: str) -> str:
    """The status polling shows for a stored one."""
    for polled, stored in POLLED_STATUSES.items():
        if status in stored:
            return polled
    return status
