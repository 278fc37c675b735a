"""Task and delivery statuses are spelled once, in ``genhook.statuses``.

Everywhere else in ``src/genhook`` a status is a ``TaskStatus`` or ``DeliveryStatus`` member:
no string constant equal to a status value, and no hand-written SQL that quotes one
(``status = 'pending'``). The migrations are history and are left as written.
"""

from __future__ import annotations

import ast
import json
import re
from collections import Counter
from pathlib import Path

from genhook.statuses import DeliveryStatus, TaskStatus
from genhook.task_states import ACTIVE, POLLED_STATUSES, TERMINAL, UNSUCCESSFUL

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "genhook"
HOME = "statuses.py"
SKIPPED = ("db/migrations/",)
VALUES = frozenset(s.value for s in (*TaskStatus, *DeliveryStatus))
QUOTED = re.compile("'(" + "|".join(sorted(VALUES)) + ")'")

# The same word where it is not a status, with how often it appears there. Keep it short:
# a status belongs in the enums.
NOT_STATUSES: dict[tuple[str, str], int] = {
    # Timeouts: httpx's and the database driver's keyword, a span's error kind (and the
    # prefix of the error text it is read from), and a wake-up that came from the clock.
    ("client/_client.py", "timeout"): 1,
    ("db/database.py", "timeout"): 1,
    ("tracing.py", "timeout"): 2,
    ("db/wakeups/port.py", "timeout"): 1,
    # A table column: when a key was created.
    ("cli/__init__.py", "created"): 1,
    ("cli/webhooks.py", "created"): 1,
    # An upstream queue's own job states, which that service's configuration maps.
    ("engines/upstream/_config.py", "completed"): 1,
    ("engines/upstream/_config.py", "failed"): 1,
    ("engines/upstream/_config.py", "canceled"): 1,
}


def _sources() -> list[tuple[str, ast.AST]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative == HOME or relative.startswith(SKIPPED):
            continue
        found.append((relative, ast.parse(path.read_text(encoding="utf-8"), filename=relative)))
    return found


def test_no_bare_status_outside_its_enum() -> None:
    seen: Counter[tuple[str, str]] = Counter()
    quoted: list[str] = []
    for relative, tree in _sources():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            if node.value in VALUES:
                seen[(relative, node.value)] += 1
            for value in QUOTED.findall(node.value):
                quoted.append(f"{relative}:{node.lineno}: '{value}'")
    unexpected = {key: n for key, n in seen.items() if NOT_STATUSES.get(key) != n}
    assert not unexpected, (
        "a status spelled as a string; use genhook.statuses.TaskStatus or DeliveryStatus "
        f"(or, if the word is not a status there, explain it in NOT_STATUSES): {unexpected}"
    )
    assert not quoted, f"SQL that quotes a status; interpolate the enum member: {quoted}"
    stale = sorted(set(NOT_STATUSES) - set(seen))
    assert not stale, f"NOT_STATUSES lists words no longer there: {stale}"


def test_the_scan_sees_the_sources() -> None:
    sources = dict(_sources())
    assert "sender/queue/_sqlite.py" in sources and "api/routes_webhooks.py" in sources
    assert not any(name.startswith(SKIPPED) or name == HOME for name in sources)


def test_members_are_the_wire_strings() -> None:
    assert [s.value for s in TaskStatus] == [
        "created",
        "processing",
        "completed",
        "failed",
        "timeout",
        "canceled",
    ]
    assert [s.value for s in DeliveryStatus] == ["pending", "delivered", "undeliverable"]
    for status in (*TaskStatus, *DeliveryStatus):
        assert status == status.value and hash(status) == hash(status.value)
        assert str(status) == f"{status}" == status.value
        assert repr(status) == repr(status.value)
        assert json.dumps({"status": status}) == json.dumps({"status": status.value})


def test_the_sets_are_built_from_the_members() -> None:
    assert set(ACTIVE) | set(TERMINAL) == set(TaskStatus)
    assert not set(ACTIVE) & set(TERMINAL)
    assert set(UNSUCCESSFUL) == set(TERMINAL) - {TaskStatus.COMPLETED}
    assert TaskStatus.TIMEOUT not in POLLED_STATUSES
    assert {s for stored in POLLED_STATUSES.values() for s in stored} == set(TaskStatus)
    for status in (*ACTIVE, *TERMINAL, *POLLED_STATUSES):
        assert isinstance(status, TaskStatus)


def test_the_typescript_sdk_spells_the_same_task_statuses() -> None:
    """The TypeScript SDK cannot import the enum, so its copy is checked against it here."""
    source = (
        Path(__file__).resolve().parents[2] / "sdks" / "typescript" / "src" / "models.ts"
    ).read_text()
    union = re.search(r"export type TaskStatus =([^;]*);", source)
    terminal = re.search(r"TERMINAL_STATUSES[^=]*= new Set\(\[([^\]]*)\]", source)
    assert union is not None and terminal is not None
    assert re.findall(r'"(\w+)"', union.group(1)) == [status.value for status in TaskStatus]
    assert set(re.findall(r'"(\w+)"', terminal.group(1))) == set(TERMINAL)
