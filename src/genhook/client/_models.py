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
from genhook.schema_marks import NO_EFFECT as NO_EFFECT
from genhook.statuses import TaskStatus
from genhook.task_states import TERMINAL_STATUSES as TERMINAL_STATUSES
from genhook.task_states import UNSUCCESSFUL


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float_or_none(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


@dataclass(frozen=True, slots=True)
class LogLine:
    """One short line an engine logged while running a task."""

    at: str
    message: str

    @classmethod
    def parse_list(cls, value: Any) -> list[LogLine]:
        if not isinstance(value, list):
            return []
        return [
            cls(at=str(item.get("at", "")), message=str(item.get("message", "")))
            for item in value
            if isinstance(item, dict)
        ]


def _float(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


@dataclass(frozen=True, slots=True)
class SttSegment:
    """A stretch of the transcript; times in seconds from the start of the audio."""

    start: float
    end: float
    text: str


@dataclass(frozen=True, slots=True)
class SttWord:
    """One word with its timing and the model's confidence (0 to 1)."""

    word: str
    start: float
    end: float
    probability: float


@dataclass(frozen=True, slots=True)
class SttResult:
    """The ``stt_result`` of a completed speech-to-text task."""

    text: str
    language: str
    language_probability: float
    duration: float
    segments: list[SttSegment] = field(default_factory=list)
    words: list[SttWord] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SttResult:
        return cls(
            text=_str_or_none(data.get("text")) or "",
            language=_str_or_none(data.get("language")) or "",
            language_probability=_float(data.get("language_probability")),
            duration=_float(data.get("duration")),
            segments=[
                SttSegment(_float(s.get("start")), _float(s.get("end")), str(s.get("text", "")))
                for s in _dicts(data.get("segments"))
            ],
            words=[
                SttWord(
                    str(w.get("word", "")),
                    _float(w.get("start")),
                    _float(w.get("end")),
                    _float(w.get("probability")),
                )
                for w in _dicts(data.get("words"))
            ],
        )


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
    # While waiting: tasks ahead of this one for its model.
    queue_position: int | None = None
    # While running: when it started and, when the engine reports it, its progress (0 to 1).
    started_at: str | None = None
    progress: float | None = None
    # Engine log lines: all of them with ``result(logs=True)``, the new ones in an event.
    logs: list[LogLine] = field(default_factory=list)
    stt_result: SttResult | None = None
    # When the outputs are deleted (ISO 8601); their URLs answer 410 after it.
    outputs_expire_at: str | None = None
    # high, normal or low: the order among the account's own waiting tasks.
    priority: str = "normal"
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
            queue_position=_int_or_none(data.get("queue_position")),
            started_at=_str_or_none(data.get("started_at")),
            progress=_float_or_none(data.get("progress")),
            logs=LogLine.parse_list(data.get("logs")),
            stt_result=SttResult.from_json(stt)
            if isinstance(stt := data.get("stt_result"), dict)
            else None,
            outputs_expire_at=_str_or_none(data.get("outputs_expire_at")),
            priority=_str_or_none(data.get("priority")) or "normal",
            raw=data,
        )

    @property
    def done(self) -> bool:
        """True once the task reached a terminal state; polling can stop."""
        return self.status in TERMINAL_STATUSES

    @property
    def succeeded(self) -> bool:
        return self.status == TaskStatus.COMPLETED

    @property
    def canceled(self) -> bool:
        return self.status == TaskStatus.CANCELED

    def raise_for_failure(self) -> Prediction:
        """Return self when completed or still running; raise ``TaskFailed`` otherwise."""
        if self.status in UNSUCCESSFUL:
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


@dataclass(frozen=True, slots=True)
class TaskEvent:
    """One event of a task's stream: its ``id`` (pass it back as ``last_event_id`` to
    resume), the status it reports and the task as it then was."""

    id: str
    event: str
    prediction: Prediction

    @property
    def done(self) -> bool:
        return self.prediction.done


@dataclass(frozen=True, slots=True)
class TaskPage:
    """One page of the account's tasks, newest first; pass ``next_cursor`` for the next."""

    items: list[Prediction]
    next_cursor: str | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskPage:
        items = data.get("items")
        return cls(
            items=[
                Prediction.from_json(item)
                for item in (items if isinstance(items, list) else [])
                if isinstance(item, dict)
            ],
            next_cursor=_str_or_none(data.get("next_cursor")),
            raw=data,
        )


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """One model of the service's catalogue (``GET /api/v1/models``)."""

    id: str
    kind: str
    description: str
    submit_paths: list[str]
    request_schema: dict[str, Any]
    pricing: dict[str, Any]
    deadline_seconds: float | None
    # Named values of request fields with what each is: voices (engine, language), styles.
    choices: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelInfo:
        paths = data.get("submit_paths")
        choices = data.get("choices")
        schema = data.get("request_schema")
        pricing = data.get("pricing")
        deadline = data.get("deadline_seconds")
        return cls(
            id=str(data.get("id", "")),
            kind=str(data.get("kind", "")),
            description=str(data.get("description", "")),
            submit_paths=[p for p in paths if isinstance(p, str)]
            if isinstance(paths, list)
            else [],
            request_schema=dict(schema) if isinstance(schema, dict) else {},
            pricing=dict(pricing) if isinstance(pricing, dict) else {},
            deadline_seconds=float(deadline)
            if isinstance(deadline, int | float) and not isinstance(deadline, bool)
            else None,
            choices=dict(choices) if isinstance(choices, dict) else {},
            raw=data,
        )

    @property
    def loras(self) -> list[dict[str, Any]]:
        """The LoRA adapters a local model offers (``choices.loras``): name, description,
        default scale and price; pass them as ``loras=["film:0.8"]``."""
        offered = self.choices.get("loras")
        return [c for c in offered if isinstance(c, dict)] if isinstance(offered, list) else []

    @property
    def fields(self) -> list[str]:
        """The request fields the model takes, in schema order."""
        properties = self.request_schema.get("properties")
        return list(properties) if isinstance(properties, dict) else []


def lora(choice: str | dict[str, Any]) -> dict[str, Any]:
    """A request's LoRA adapter from ``NAME``, ``NAME:SCALE`` (``film:0.8``) or an
    ``https://`` URL (where the service allows them), or a ready ``{"name", "scale"}``
    object, passed on as is; ``ValueError`` for a scale that is not a number."""
    if isinstance(choice, dict):
        return choice
    if choice.startswith(("https://", "http://")):
        return {"url": choice}
    name, colon, scale = choice.rpartition(":")
    if not colon:
        return {"name": choice}
    try:
        return {"name": name, "scale": float(scale)}
    except ValueError:
        raise ValueError(f"LoRA {choice!r}: the scale after ':' must be a number") from None


def model_list(data: Any) -> list[ModelInfo]:
    models = data.get("models") if isinstance(data, dict) else None
    return [ModelInfo.from_json(m) for m in models or [] if isinstance(m, dict)]
