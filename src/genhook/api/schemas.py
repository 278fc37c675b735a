"""Response models, for the OpenAPI document (handlers return plain JSON for speed)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from genhook.statuses import TaskStatus


class Urls(BaseModel):
    get: str = Field(description="The result endpoint of this task.")
    cancel: str | None = Field(default=None, description="POST here to cancel the task.")


class LogLineModel(BaseModel):
    at: str = Field(description="ISO 8601 UTC time the engine logged the line.")
    message: str


class SttSegment(BaseModel):
    start: float = Field(description="Seconds from the start of the audio.")
    end: float
    text: str


class SttWord(BaseModel):
    word: str
    start: float = Field(description="Seconds from the start of the audio.")
    end: float
    probability: float = Field(description="The model's confidence in the word, 0 to 1.")


class SttResult(BaseModel):
    text: str = Field(description="The full transcript.")
    language: str = Field(description="The spoken language, given or detected (ISO 639-1).")
    language_probability: float
    duration: float = Field(description="Seconds of audio transcribed.")
    segments: list[SttSegment]
    words: list[SttWord] = Field(description="Empty when word_timestamps is false.")


class PredictionResponse(BaseModel):
    id: str = Field(description="Task id; fetch the result with it.")
    model: str
    status: Literal[
        TaskStatus.CREATED,
        TaskStatus.PROCESSING,
        TaskStatus.COMPLETED,
        TaskStatus.FAILED,
        TaskStatus.CANCELED,
    ]
    outputs: list[str] = Field(
        description="Output URLs (or raw base64 strings when enable_base64_output is true); "
        "empty unless status is completed."
    )
    has_nsfw_contents: list[bool] = Field(description="One NSFW flag per output.")
    created_at: str = Field(description="ISO 8601 UTC creation time.")
    urls: Urls
    error: str | None = Field(default=None, description="Present when status is failed.")
    error_code: int | None = Field(default=None, description="Present when status is failed.")
    priority: Literal["high", "low"] | None = Field(
        default=None,
        description="The task's priority when the submit asked for one other than normal "
        "(absent: normal).",
    )
    info: dict[str, Any] | None = Field(
        default=None, description="Engine details, e.g. how the prompt was understood."
    )
    completed_at: str | None = Field(default=None, description="ISO 8601 UTC end time.")
    queue_position: int | None = Field(
        default=None, description="While created: runnable tasks of its model ahead of it."
    )
    started_at: str | None = Field(
        default=None, description="While processing: ISO 8601 UTC start of the current attempt."
    )
    progress: float | None = Field(
        default=None, description="While processing, when the engine reports it: 0 to 1."
    )
    logs: list[LogLineModel] | None = Field(
        default=None, description="The engine's log lines, with ?logs=1 (and in stream events)."
    )
    stt_result: SttResult | None = Field(
        default=None, description="The transcript of a completed speech-to-text task."
    )
    outputs_expire_at: str | None = Field(
        default=None,
        description="ISO 8601 UTC time the outputs are deleted (GENHOOK_OUTPUT_RETENTION "
        "after the task ended); their URLs answer 410 after it.",
    )


class TaskListResponse(BaseModel):
    items: list[PredictionResponse] = Field(description="Newest first.")
    next_cursor: str | None = Field(description="Pass as cursor for the next page; null: last.")


class UsageItem(BaseModel):
    task_id: str
    model: str
    tier: str
    output_pixels: int
    input_images: int
    lines: list[tuple[str, str]]
    amount_usd: str
    created_at: str


class UsageResponse(BaseModel):
    account_id: str
    currency: Literal["USD"] = "USD"
    total_usd: str
    task_count: int
    items: list[UsageItem]
    next_cursor: int | None = None
