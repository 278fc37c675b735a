"""The published error-code table and configuration reference stay in step with the code."""

from __future__ import annotations

import json
from pathlib import Path

from genhook.config import Settings
from genhook.errors import ERROR_CODE_DESCRIPTIONS, ErrorCode
from genhook.metrics import metric_names

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_error_code_is_documented() -> None:
    api = (DOCS / "api.md").read_text()
    for code in ErrorCode:
        assert f"| {int(code)} | `{code.name}` |" in api, code
        assert code in ERROR_CODE_DESCRIPTIONS


def _tables(markdown: str) -> list[list[str]]:
    """Each run of consecutive table lines, as it renders: a blank line ends a table."""
    tables: list[list[str]] = []
    current: list[str] = []
    for line in [*markdown.splitlines(), ""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    return tables


def test_the_error_tables_of_api_md_are_whole_and_in_order() -> None:
    api = (DOCS / "api.md").read_text()
    errors = api[api.index("## Errors") : api.index("## Webhook events")]
    tables = _tables(errors)
    # One status table and one error_code table, each with its header row, no fragments.
    assert [table[0] for table in tables] == [
        "| Status | When |",
        "| `error_code` | Name | Meaning |",
    ]
    for table in tables:
        keys = [int(row.split("|")[1]) for row in table[2:]]
        assert keys == sorted(set(keys)), keys
    assert len(tables[1]) - 2 == len(ErrorCode)


def test_every_setting_is_documented() -> None:
    configuration = (DOCS / "configuration.md").read_text()
    for name in Settings.model_fields:
        assert f"`GENHOOK_{name.upper()}`" in configuration, name


def test_every_metric_is_documented() -> None:
    operations = (DOCS / "operations.md").read_text()
    for name in metric_names():
        assert f"| `{name}` |" in operations, name


def test_the_local_model_entries_of_the_docs_are_valid() -> None:
    """One entry per pipeline family, as a reader copies it: each passes the entry's checks
    (all but its weights' directory) and the families are all there."""
    from genhook.engines.local._config import FAMILIES, LocalModel

    page = (DOCS / "engines" / "local-models.md").read_text()
    block = page.split("## One entry per family", 1)[1].split("```json", 1)[1].split("```", 1)[0]
    models = [LocalModel.model_validate(entry) for entry in json.loads(block)]
    assert {model.pipeline for model in models} == set(FAMILIES)


def test_the_task_path_of_architecture_md_names_real_code() -> None:
    """Every module and every ``Class.method`` / ``function()`` the diagram of "The path of a
    task" names exists, in a module named on the same line (or in the diagram)."""
    import importlib
    import re

    text = (DOCS / "architecture.md").read_text()
    section = text[text.index("## The path of a task") : text.index("## The path of a delivery")]
    block = section.split("```")[1]
    source = DOCS.parent / "src" / "genhook"
    every = re.findall(r"[\w/]+\.py", block)
    for path in every:
        assert (source / path).is_file(), path
    modules = {
        path: importlib.import_module("genhook." + path.removesuffix(".py").replace("/", "."))
        for path in every
    }
    checked = 0
    for line in block.splitlines():
        near = [modules[path] for path in re.findall(r"[\w/]+\.py", line)] or list(modules.values())
        for owner, name in re.findall(r"\b([A-Z]\w*)\.([a-z_]\w*)\b", line):
            found = [m for m in modules.values() if hasattr(getattr(m, owner, None), name)]
            assert found, f"{owner}.{name} (line: {line.strip()})"
            checked += 1
        for name in re.findall(r"\b([a-z_]\w*)\(\)", line):
            assert any(hasattr(m, name) for m in near), f"{name}() (line: {line.strip()})"
            checked += 1
    assert checked >= 15, checked
