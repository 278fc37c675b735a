"""The statuses of a task and of a webhook delivery, defined once for the server, the SDK
and the CLI.

Dependency-free so the SDK-only install can import it. Both are ``StrEnum``s: a member is a
``str`` equal to its value, so it compares equal to a status read from the database or a
JSON answer, binds in SQL as that string and serializes to it in JSON. ``tests/unit/
test_statuses.py`` fails when a status value is spelled as a bare string anywhere else in
``src/genhook`` (migrations excepted: they are history).

The sets and helpers built on the task states (terminal, active, what polling shows) live in
``genhook.task_states``.
"""

from __future__ import annotations

from enum import StrEnum


class _Status(StrEnum):
    def __repr__(self) -> str:
        # As the bare string it replaces: log lines and validation messages that quote a
        # status (``Input should be 'delivered' or ...``) read as before.
        return repr(self.value)


class TaskStatus(_Status):
    """A task's state (``tasks.status``).

    created -> processing -> completed | failed | timeout | canceled; processing -> created
    when a lease is lost. A terminal state is final. Polling shows ``timeout`` as ``failed``.
    """

    CREATED = "created"
    PROCESSING = "processing"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELED = "canceled"


class DeliveryStatus(_Status):
    """A webhook delivery's state: pending until the receiver acknowledges it (delivered) or
    it is given up (undeliverable); a redelivery makes it pending again."""

    PENDING = "pending"
    DELIVERED = "delivered"
    UNDELIVERABLE = "undeliverable"
