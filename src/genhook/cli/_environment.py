"""The settings of a command, or one line that says which variable is wrong and why.

pydantic-settings reports a bad ``GENHOOK_*`` value as a validation error of the field (or,
for a JSON value that does not parse, a ``SettingsError`` whose cause is the JSON error):
shown as they are, they were a traceback naming ``local_models``, not the variable to fix.
"""

from __future__ import annotations

import re
from typing import Any

import typer
from pydantic import ValidationError
from pydantic_settings import SettingsError
from rich.console import Console

from genhook.config import Settings

console = Console(stderr=True)


def load_settings(**overrides: Any) -> Settings:
    """``Settings`` from the environment and the command's options (``None``: unset)."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except (ValidationError, SettingsError) as exc:
        console.print(f"[red]error:[/red] {describe(exc)}", highlight=False)
        raise typer.Exit(code=1) from None


def describe(exc: ValidationError | SettingsError) -> str:
    if isinstance(exc, SettingsError):
        match = re.search(r'field "(\w+)"', str(exc))
        name = _variable(match.group(1)) if match else "a GENHOOK_ setting"
        return f"{name} is not valid JSON: {exc.__cause__ or exc}"
    problems = []
    for error in exc.errors():
        field, *path = error["loc"]
        where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path)
        problems.append(f"{_variable(str(field))}{where}: {error['msg']}")
    return "; ".join(problems)


def _variable(field: str) -> str:
    return f"GENHOOK_{field.upper()}"
