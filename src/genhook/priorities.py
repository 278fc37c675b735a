"""Task priorities: the names the API, the SDK and the CLI speak, and the integers the
database keeps (``tasks.priority``, ``api_keys.max_priority``).

Dependency-free so the SDK-only install can import it. A priority orders an account's own
waiting tasks; it never takes workers from another account (docs/scheduling.md).
"""

from __future__ import annotations

from enum import StrEnum


class Priority(StrEnum):
    """A task's priority; a member equals its name, as JSON and the CLI send it."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"

    @property
    def level(self) -> int:
        """The stored integer: higher is taken first."""
        return LEVELS[self]

    @classmethod
    def of_level(cls, level: int) -> Priority:
        """The name of a stored level; a level outside the named ones is shown as the
        nearest name (a row written by a later version with finer levels stays readable)."""
        if level >= LEVELS[cls.HIGH]:
            return cls.HIGH
        if level <= LEVELS[cls.LOW]:
            return cls.LOW
        return cls.NORMAL


LEVELS: dict[str, int] = {Priority.HIGH: 1, Priority.NORMAL: 0, Priority.LOW: -1}
DEFAULT = Priority.NORMAL
NAMES = tuple(Priority)


def names_text() -> str:
    """``'high', 'normal' or 'low'``, for messages."""
    quoted = [repr(str(name)) for name in NAMES]
    return ", ".join(quoted[:-1]) + " or " + quoted[-1]


def parse(value: object) -> Priority | None:
    """``value`` as a priority, or None when it is not one of the names (exact, lower case:
    the API's types are strict)."""
    if isinstance(value, str) and value in LEVELS:
        return Priority(value)
    return None
