"""Tasks built from returned rows (``hot_path.claimed``), in a process that has made no ORM
query yet: a worker's first claim is the first thing its process does with the ORM."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
from genhook.db import Task
from genhook.tasks.store.hot_path import claimed

columns = {column.key: None for column in Task.__table__.columns}
row = columns | {"id": "t-1", "webhook_events": "processing"}
(task,) = claimed([row])
assert (task.id, task.webhook_events, task.outputs) == ("t-1", "processing", None)
task.outputs = ["outputs/a.png"]
assert task.outputs == ["outputs/a.png"]
print("ok")
"""


def test_a_task_built_from_a_row_reads_and_writes_in_a_fresh_process() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
