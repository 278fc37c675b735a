"""Validation messages in the service's own words, for every error Pydantic can raise.

Pydantic's texts ("String should have at least 1 character", "Input should be a valid
string") name its internals, not the API; each error type is described here instead, with
the field's name, so a message reads on its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_KINDS = {
    "string_type": "a string",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "list_type": "a JSON array",
    "dict_type": "a JSON object",
    "model_type": "a JSON object",
    "model_attributes_type": "a JSON object",
    "none_required": "null",
}

_BOUNDS = {
    "greater_than": ("gt", "greater than"),
    "greater_than_equal": ("ge", "at least"),
    "less_than": ("lt", "less than"),
    "less_than_equal": ("le", "at most"),
}


def _items(count: Any) -> str:
    return f"{count} item" if count == 1 else f"{count} items"


def describe(name: str, error_type: str, ctx: Mapping[str, Any] | None, fallback: str) -> str:
    """The message for one Pydantic error on field ``name``.

    ``fallback`` is used only for a ``value_error`` (our own validators' text) and for an
    error type this table does not know yet.
    """
    ctx = ctx or {}
    if error_type == "missing":
        return f"{name} is required"
    if error_type == "extra_forbidden":
        return f"{name} is not a known field; check its spelling against the API reference"
    if error_type in _KINDS:
        return f"{name} must be {_KINDS[error_type]}"
    if error_type == "string_too_short":
        minimum = ctx.get("min_length", 1)
        if minimum == 1:
            return f"{name} must not be empty"
        return f"{name} must be at least {minimum} characters"
    if error_type == "string_too_long":
        return f"{name} must be at most {ctx.get('max_length')} characters"
    if error_type == "too_short":
        return f"{name} must hold at least {_items(ctx.get('min_length'))}"
    if error_type == "too_long":
        return f"{name} must hold at most {_items(ctx.get('max_length'))}"
    if error_type in ("literal_error", "enum"):
        return f"{name} must be one of {ctx.get('expected')}"
    if error_type in _BOUNDS:
        key, words = _BOUNDS[error_type]
        return f"{name} must be {words} {ctx.get(key)}"
    if error_type in ("json_invalid", "json_type"):
        return "the body is not valid JSON"
    if error_type == "value_error" and isinstance(ctx.get("error"), ValueError):
        return str(ctx["error"])
    if error_type.startswith("string_pattern"):
        return f"{name} does not have the expected form"
    return fallback if error_type == "value_error" else f"{name} has an invalid value"
