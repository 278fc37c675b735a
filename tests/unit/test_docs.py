"""The published error-code table and configuration reference stay in step with the code."""

from __future__ import annotations

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


def test_every_setting_is_documented() -> None:
    configuration = (DOCS / "configuration.md").read_text()
    for name in Settings.model_fields:
        assert f"`GENHOOK_{name.upper()}`" in configuration, name


def test_every_metric_is_documented() -> None:
    operations = (DOCS / "operations.md").read_text()
    for name in metric_names():
        assert f"| `{name}` |" in operations, name
