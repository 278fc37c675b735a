"""Response models, for the OpenAPI document (handlers return plain JSON for speed)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class Urls(BaseModel):
    get: str = Field(description="The result endpoint of this task.")
    cancel: str | None = Field(default=None, description="POST here to cancel the task.")


class PredictionResponse(BaseModel):
    id: str = Field(description="Task id; fetch the result with it.")
    model: str
    status: Literal["created", "processing", "completed", "failed", "canceled"]
    outputs: list[str] = Field(
        description="Output URLs (or raw base64 strings when enable_base64_output is true); "
        "empty unless status is completed."
    )
    has_nsfw_contents: list[bool] = Field(description="One NSFW flag per output.")
    created_at: str = Field(description="ISO 8601 UTC creation time.")
    urls: Urls
    error: str | None = Field(default=None, description="Present when status is failed.")
    error_code: int | None = Field(default=None, description="Present when status is failed.")
    info: dict[str, Any] | None = Field(
        default=None, description="Engine details, e.g. how the prompt was understood."
    )
    completed_at: str | None = Field(default=None, description="ISO 8601 UTC end time.")
    outputs_expire_at: str | None = Field(
        default=None,
        description="ISO 8601 UTC time the outputs are deleted (GENHOOK_OUTPUT_RETENTION "
        "after the task ended); their URLs answer 410 after it.",
    )


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
