"""Handlers stay free of SQL: every query lives in its table's home module (``tasks/``,
``accounts.py``, ``sender/``, ...), and a route or CLI command only calls it. The webhook
delivery tables have one writer, the ``sender/queue/`` package; every statement on the task tables
(``tasks``, ``blobs``, ``usage_lines``, ``idempotency_keys``), read or write, is the task
store's (``tasks/store/``). The webhook side never imports the task domain, and the task
domain reaches the webhook tables only through its outbox port.

Read from the source, so a handler that grows a query fails here before review.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import genhook

PACKAGE = Path(genhook.__file__).parent
HANDLERS = sorted(
    [
        *PACKAGE.glob("api/routes_*.py"),
        PACKAGE / "console" / "routes.py",
        *PACKAGE.glob("cli/*.py"),
    ]
)
# What a session runs a statement with.
SESSION_CALLS = {"execute", "scalar", "scalars", "get", "stream", "add", "delete", "merge"}


def query_uses(source: str) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sqlalchemy":
            found.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import):
            found += [
                f"line {node.lineno}: import {alias.name}"
                for alias in node.names
                if alias.name.split(".")[0] == "sqlalchemy"
            ]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in SESSION_CALLS
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "session"
        ):
            found.append(f"line {node.lineno}: session.{node.func.attr}(...)")
    return found


def test_the_handler_list_is_not_empty() -> None:
    names = {path.name for path in HANDLERS}
    assert {"routes_tasks.py", "routes_watch.py", "routes.py", "webhooks.py"} <= names


@pytest.mark.parametrize("path", HANDLERS, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_handler_runs_no_queries(path: Path) -> None:
    assert query_uses(path.read_text()) == []


def test_the_check_finds_a_query() -> None:
    source = (
        "from sqlalchemy import select\n"
        "import sqlalchemy.orm\n"
        "async def handler(session):\n"
        "    return await session.scalars(select(Task))\n"
    )
    assert query_uses(source) == [
        "line 1: from sqlalchemy import ...",
        "line 2: import sqlalchemy.orm",
        "line 4: session.scalars(...)",
    ]


DELIVERY_TABLES = {"WebhookDelivery", "WebhookAttempt", "WebhookReplay"}


def delivery_writes(source: str) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"insert", "update", "delete"}
            and node.args
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id in DELIVERY_TABLES
        ):
            found.append(f"line {node.lineno}: {node.func.id}({node.args[0].id})")
    return found


def test_only_the_queue_writes_the_delivery_tables() -> None:
    writers: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name.startswith("sender/queue/") or "/migrations/" in name:
            continue
        if found := delivery_writes(path.read_text()):
            writers[name] = found
    assert writers == {}
    queue = "".join(path.read_text() for path in (PACKAGE / "sender" / "queue").glob("*.py"))
    assert delivery_writes(queue)


def imported_modules(source: str) -> list[str]:
    """Every module ``source`` imports, at any depth (a late import counts too)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
            found += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return found


def imports_of(source: str, package: str) -> list[str]:
    return sorted(
        {
            name
            for name in imported_modules(source)
            if name == package or name.startswith(package + ".")
        }
    )


TASK_MODELS = {"Task", "Blob", "UsageLine", "IdempotencyKey"}
TASK_TABLES = ("tasks", "blobs", "usage_lines", "idempotency_keys")
# What builds a write statement: SQLAlchemy's constructs, the dialects' upserts under the
# names the code imports them as, and the driver path's ``bound_insert``.
WRITE_CALLS = {"insert", "update", "delete", "pg_insert", "sqlite_insert", "upsert", "bound_insert"}
RAW_WRITE = re.compile(
    r"\b(INSERT\s+(OR\s+\w+\s+)?INTO|UPDATE|DELETE\s+FROM|REPLACE\s+INTO)\s+[\"`]?("
    + "|".join(TASK_TABLES)
    + r")\b",
    re.IGNORECASE,
)


def _names_in(node: ast.AST) -> set[str]:
    return {child.id for child in ast.walk(node) if isinstance(child, ast.Name)}


def task_table_writes(source: str) -> list[str]:
    """Statements that write a task table: a write construct on one of its models (also as
    ``Model.__table__``), a task model's ``__table__`` taken at all (how a Core statement on
    it is built), or SQL text that writes one of the tables."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name in WRITE_CALLS and node.args:
                models = sorted(_names_in(node.args[0]) & TASK_MODELS)
                if models:
                    found.append(f"line {node.lineno}: {name}({models[0]})")
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "__table__"
            and isinstance(node.value, ast.Name)
            and node.value.id in TASK_MODELS
        ):
            found.append(f"line {node.lineno}: {node.value.id}.__table__")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and (match := RAW_WRITE.search(node.value))
        ):
            found.append(f"line {node.lineno}: {match.group(0)!r}")
    return sorted(set(found), key=lambda line: int(line.split(":")[0].split()[1]))


def test_only_the_store_writes_the_task_tables() -> None:
    writers: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name.startswith("tasks/store/") or "/migrations/" in name:
            continue
        if found := task_table_writes(path.read_text()):
            writers[name] = found
    assert writers == {}
    store = "".join(path.read_text() for path in (PACKAGE / "tasks" / "store").glob("*.py"))
    assert task_table_writes(store)


def test_the_check_finds_a_task_table_write() -> None:
    source = (
        "stmt = update(Task).where(Task.id == 1)\n"
        "table = cast(Table, Blob.__table__)\n"
        "await session.execute(delete(IdempotencyKey))\n"
        "upsert = pg_insert(UsageLine)\n"
        "select(Task.id)\n"
        "update(WebhookDelivery)\n"
        'sql = "UPDATE tasks SET status = 1"\n'
        'read = "SELECT * FROM tasks"\n'
    )
    assert task_table_writes(source) == [
        "line 1: update(Task)",
        "line 2: Blob.__table__",
        "line 3: delete(IdempotencyKey)",
        "line 4: pg_insert(UsageLine)",
        "line 7: 'UPDATE tasks'",
    ]


# What reads a table: a select or an exists, a count's ``select_from``, a join, a session's
# lookup by primary key; with a task model among its arguments.
READ_CALLS = {"select", "exists", "select_from", "join", "outerjoin", "get", "correlate"}
RAW_READ = re.compile(r"\b(FROM|JOIN)\s+[\"`]?(" + "|".join(TASK_TABLES) + r")\b")


def task_table_reads(source: str) -> list[str]:
    """Statements that read a task table: a read construct over one of its models, a column
    of one (what a condition, an order or a count is built from), or SQL text that reads one
    of the tables (its keywords in capitals, as the service writes SQL)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name in READ_CALLS:
                models = sorted(set().union(*(_names_in(arg) for arg in node.args)) & TASK_MODELS)
                if models:
                    found.append(f"line {node.lineno}: {name}({models[0]})")
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in TASK_MODELS
            and not node.attr.startswith("__")
        ):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and (match := RAW_READ.search(node.value))
        ):
            found.append(f"line {node.lineno}: {match.group(0)!r}")
    return sorted(set(found), key=lambda line: (int(line.split(":")[0].split()[1]), line))


def test_only_the_store_reads_the_task_tables() -> None:
    readers: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name.startswith("tasks/store/") or "/migrations/" in name:
            continue
        if found := task_table_reads(path.read_text()):
            readers[name] = found
    assert readers == {}
    assert task_table_reads((PACKAGE / "tasks" / "store" / "reads.py").read_text())


def test_the_check_finds_a_task_table_read() -> None:
    source = (
        "stmt = select(Task)\n"
        "count = select(func.count()).select_from(UsageLine)\n"
        "row = await session.get(IdempotencyKey, (account, key))\n"
        "due = exists().where(Blob.key == key)\n"
        'sql = "SELECT id FROM tasks WHERE status = 1"\n'
        "def handler(task: Task) -> Task:\n"
        "    return Task(id=task.id)\n"
        "select(WebhookDelivery.id)\n"
        'doc = "tasks from tasks/ and blobs"\n'
        "name = Task.__name__\n"
    )
    assert task_table_reads(source) == [
        "line 1: select(Task)",
        "line 2: select_from(UsageLine)",
        "line 3: get(IdempotencyKey)",
        "line 4: Blob.key",
        "line 5: 'FROM tasks'",
    ]


# The webhook side's tables: the task domain reaches them only through its outbox port.
WEBHOOK_MODELS = {"WebhookDelivery", "WebhookAttempt", "WebhookReplay", "WebhookDestination"}
RAW_WEBHOOK = re.compile(
    r"\b(FROM|JOIN|INTO|UPDATE)\s+[\"`]?(webhook_deliveries|webhook_attempts|webhook_replays"
    r"|webhook_destinations)\b",
    re.IGNORECASE,
)


def webhook_table_uses(source: str) -> list[str]:
    """Every mention of a webhook model (imported, named, or a column of it), and SQL text
    on a webhook table."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            found += [
                f"line {node.lineno}: import {alias.name}"
                for alias in node.names
                if alias.name in WEBHOOK_MODELS
            ]
        elif isinstance(node, ast.Name) and node.id in WEBHOOK_MODELS:
            found.append(f"line {node.lineno}: {node.id}")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and (match := RAW_WEBHOOK.search(node.value))
        ):
            found.append(f"line {node.lineno}: {match.group(0)!r}")
    return sorted(set(found), key=lambda line: (int(line.split(":")[0].split()[1]), line))


def test_the_task_domain_reaches_the_webhook_tables_only_through_its_port() -> None:
    """``tasks/`` names no webhook table: what it needs of them (the reconciler's tasks
    without a terminal delivery, retention's pending deliveries) comes from the outbox port
    (``tasks/outbox.py``), as a condition inside its own statement."""
    found: dict[str, list[str]] = {}
    for path in sorted((PACKAGE / "tasks").rglob("*.py")):
        if uses := webhook_table_uses(path.read_text()):
            found[path.relative_to(PACKAGE).as_posix()] = uses
    assert found == {}


def test_the_check_finds_a_webhook_table() -> None:
    source = (
        "from genhook.db import Task, WebhookDelivery\n"
        "missing = select(Task).outerjoin(WebhookDelivery)\n"
        "stmt = exists().where(WebhookAttempt.delivery_id == 1)\n"
        'sql = "DELETE FROM webhook_replays WHERE 1"\n'
        'doc = "webhook deliveries of a task"\n'
    )
    assert webhook_table_uses(source) == [
        "line 1: import WebhookDelivery",
        "line 2: WebhookDelivery",
        "line 3: WebhookAttempt",
        "line 4: 'FROM webhook_replays'",
    ]


def test_the_sender_never_imports_the_task_domain() -> None:
    """``tasks/`` publishes through its outbox port; ``sender/`` implements it without
    knowing the task domain (``genhook.wiring`` puts the two together)."""
    found: dict[str, list[str]] = {}
    for path in sorted((PACKAGE / "sender").rglob("*.py")):
        if names := imports_of(path.read_text(), "genhook.tasks"):
            found[path.relative_to(PACKAGE).as_posix()] = names
    assert found == {}


def test_the_import_check_finds_a_late_import() -> None:
    source = (
        "from genhook.db import Task\n"
        "def late():\n"
        "    from genhook.tasks.lifecycle import Lifecycle\n"
        "    import genhook.tasks.views\n"
        "from genhook import tasks\n"
    )
    assert imports_of(source, "genhook.tasks") == [
        "genhook.tasks",
        "genhook.tasks.lifecycle",
        "genhook.tasks.lifecycle.Lifecycle",
        "genhook.tasks.views",
    ]


# What the database layer may not import: the layers built on it.
ABOVE_THE_DATABASE = ("genhook.runtime", "genhook.tasks", "genhook.api", "genhook.engines")


def test_the_database_layer_imports_nothing_above_it() -> None:
    """``db/`` owns its wake-ups (``db/wakeups/``: ``LISTEN``/``NOTIFY`` on PostgreSQL, local
    sockets on SQLite), so a commit announces work without reaching up into ``runtime/``;
    the layers above import ``db/``, never the other way."""
    found: dict[str, list[str]] = {}
    for path in sorted((PACKAGE / "db").rglob("*.py")):
        source = path.read_text()
        names = [name for package in ABOVE_THE_DATABASE for name in imports_of(source, package)]
        if names:
            found[path.relative_to(PACKAGE).as_posix()] = names
    assert found == {}
    assert (PACKAGE / "db" / "wakeups" / "__init__.py").exists()


def test_the_import_check_finds_a_runtime_import() -> None:
    source = "from genhook.runtime import wakeups\nimport genhook.runtime.lifeline\n"
    assert imports_of(source, "genhook.runtime") == [
        "genhook.runtime",
        "genhook.runtime.lifeline",
        "genhook.runtime.wakeups",
    ]


def private_engine_imports(name: str, source: str) -> list[str]:
    """Imports of an engine package's private module (``genhook.engines.X._y``) by a module
    outside that package (``name``: the importer's path under the package root)."""
    found: list[str] = []
    for module in imported_modules(source):
        parts = module.split(".")
        if len(parts) < 4 or parts[:2] != ["genhook", "engines"] or not parts[3].startswith("_"):
            continue
        if not name.startswith(f"engines/{parts[2]}/"):
            found.append(".".join(parts[:4]))
    return sorted(set(found))


def test_no_engine_imports_another_engines_private_modules() -> None:
    """What several engines share (decoding, the NSFW detector, prompt moderation, output
    fitting and encoding, composition, the video encoder) is ``engines/media/``, public; an
    engine's underscored modules are its own."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if names := private_engine_imports(name, path.read_text()):
            found[name] = names
    assert found == {}


def test_the_engine_check_finds_a_private_import() -> None:
    source = (
        "from genhook.engines.image_edit import _output\n"
        "from genhook.engines.image_edit._plan import Step\n"
        "from genhook.engines.media.output import fit\n"
        "def late():\n"
        "    from genhook.engines.local._config import check_device\n"
    )
    assert private_engine_imports("engines/local/_engine.py", source) == [
        "genhook.engines.image_edit._output",
        "genhook.engines.image_edit._plan",
    ]
    assert private_engine_imports("engines/image_edit/_engine.py", source) == [
        "genhook.engines.local._config"
    ]
