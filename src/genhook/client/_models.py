"""Typed views of the service's JSON answers: the prediction and the webhook body.

Plain dataclasses, not pydantic: the SDK must not need the server's dependencies. Every
field of the schema is optional, so parsing never fails on a missing one; ``raw`` keeps the
whole object for fields this version does not know yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from genhook.client._errors import TaskFailed

TERMINAL_STATUSES = frozenset({"completed", "failed", "timeout"})


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class Prediction:
    """A task as the submit and result endpoints (and a webhook's ``payload``) describe it."""

    id: str
    model: str
    status: str
    outputs: list[str] = field(default_factory=list)
    has_nsfw_contents: list[bool] = field(default_factory=list)
    created_at: str | None = None
    completed_at: str | None = None
    urls: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    error_code: int | None = None
    info: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any], *, default_id: str = "") -> Prediction:
        outputs = data.get("outputs")
        nsfw = data.get("has_nsfw_contents")
        urls = data.get("urls")
        info = data.get("info")
        created_at = data.get("created_at")
        completed_at = data.get("completed_at")
        return cls(
            id=_str_or_none(data.get("id")) or default_id,
            model=_str_or_none(data.get("model")) or "",
            status=_str_or_none(data.get("status")) or "",
            outputs=[o for o in outputs if isinstance(o, str)] if isinstance(outputs, list) else [],
            has_nsfw_contents=[bool(f) for f in nsfw] if isinstance(nsfw, list) else [],
            created_at=str(created_at) if created_at is not None else None,
            completed_at=str(completed_at) if completed_at is not None else None,
            urls={str(k): str(v) for k, v in urls.items()} if isinstance(urls, dict) else {},
            error=_str_or_none(data.get("error")),
            error_code=_int_or_none(data.get("error_code")),
            info=dict(info) if isinstance(info, dict) else {},
            raw=data,
        )

    @property
    def done(self) -> bool:
        """True once the task reached a terminal state; polling can stop."""
        return self.status in TERMINAL_STATUSES

    @property
    def succeeded(self) -> bool:
        return self.status == "completed"

    def raise_for_failure(self) -> Prediction:
        """Return self when completed or still running; raise ``TaskFailed`` otherwise."""
        if self.status in ("failed", "timeout"):
            code = f" (error_code {self.error_code})" if self.error_code is not None else ""
            message = self.error or f"task {self.status}"
            raise TaskFailed(f"task {self.id} {self.status}{code}: {message}", self)
        return self


def _decimal(value: Any) -> Decimal:
    try:
        return Decimal(str(value))
    except InvalidOperation:
        return Decimal(0)


@dataclass(frozen=True, slots=True)
class UsageItem:
    """One billed task; money is Decimal, never float."""

    task_id: str
    model: str
    tier: str
    output_pixels: int
    input_images: int
    lines: list[tuple[str, Decimal]]
    amount_usd: Decimal
    created_at: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> UsageItem:
        lines = data.get("lines")
        return cls(
            task_id=str(data.get("task_id", "")),
            model=str(data.get("model", "")),
            tier=str(data.get("tier", "")),
            output_pixels=_int_or_none(data.get("output_pixels")) or 0,
            input_images=_int_or_none(data.get("input_images")) or 0,
            lines=[
                (str(line[0]), _decimal(line[1]))
                for line in (lines if isinstance(lines, list) else [])
                if isinstance(line, list | tuple) and len(line) == 2
            ],
            amount_usd=_decimal(data.get("amount_usd", "0")),
            created_at=str(data.get("created_at", "")),
        )


@dataclass(frozen=True, slots=True)
class Usage:
    """One page of the account's usage; pass ``next_cursor`` back for the next page."""

    account_id: str
    currency: str
    total_usd: Decimal
    task_count: int
    items: list[UsageItem]
    next_cursor: int | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Usage:
        items = data.get("items")
        return cls(
            account_id=str(data.get("account_id", "")),
            currency=str(data.get("currency", "USD")),
            total_usd=_decimal(data.get("total_usd", "0")),
            task_count=_int_or_none(data.get("task_count")) or 0,
            items=[
                UsageItem.from_json(i)
                for i in (items if isinstance(items, list) else [])
                if isinstance(i, dict)
            ],
            next_cursor=_int_or_none(data.get("next_cursor")),
            raw=data,
        )
