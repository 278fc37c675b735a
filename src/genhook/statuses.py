"""Task statuses, shared by the server, the SDK and the CLI so every consumer agrees on
which states end a task (a stream ends, a wait returns, a poll loop stops).

Dependency-free: the SDK imports it without the server's packages.
"""

from __future__ import annotations

# Stored terminal states. Polling shows ``timeout`` as ``failed`` (contract 2.2).
TERMINAL_STATUSES = frozenset({"completed", "failed", "timeout"})
ACTIVE_STATUSES = frozenset({"created", "processing"})

# What ``status`` in a result may be, mapped to the stored states it covers.
POLLED_STATUSES: dict[str, tuple[str, ...]] = {
    "created": ("created",),
    "processing": ("processing",),
    "completed": ("completed",),
    "failed": ("failed", "timeout"),
}


def is_terminal(status: str) -> bool:
    return status in TERMINAL_STATUSES


def polled_status(status: str) -> str:
    """The status polling shows for a stored one."""
    for polled, stored in POLLED_STATUSES.items():
        if status in stored:
            return polled
    return status
