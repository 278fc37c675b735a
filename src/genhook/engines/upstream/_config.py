"""The settings of one upstream model, read from ``GENHOOK_UPSTREAM_MODELS`` or a JSON file.

Validated when the registry is built, so a typo in an operator's file stops the service at
start with the field named, instead of failing tasks later.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from genhook.config import Settings, entry_name, model_entries, validation_problems
from genhook.engines.base import ModelKind


class QueueProtocol(BaseModel):
    """A submit-then-poll provider, described by paths and JSON pointers (RFC 6901)."""

    model_config = ConfigDict(extra="forbid")

    submit_path: str
    # The JSON body sent to ``submit_path``; a string value that is exactly ``{name}`` is
    # replaced by a request field: prompt, size, width, height, image (the first input as a
    # data URL), images (every input as data URLs), or any other field of the request.
    submit_body: dict[str, Any] = Field(
        default_factory=lambda: {"prompt": "{prompt}", "images": "{images}", "size": "{size}"}
    )
    id_pointer: str = "/id"
    # Polled with GET; ``{id}`` is replaced by the upstream job id. With ``callback``, an
    # optional safety net polled every ``poll_interval_seconds``.
    status_path: str | None = None
    status_pointer: str = "/status"
    succeeded: list[str] = Field(default_factory=lambda: ["succeeded", "completed", "COMPLETED"])
    failed: list[str] = Field(
        default_factory=lambda: ["failed", "canceled", "cancelled", "error", "FAILED"]
    )
    # Where the outputs are: a URL or data URL, a list of them, or objects with ``url``.
    result_pointer: str = "/output"
    # A separate GET for the result once succeeded (fal-like queues); ``{id}`` as above.
    result_path: str | None = None
    error_pointer: str = "/error"
    poll_interval_seconds: float = Field(default=0.5, gt=0)
    # Wait for the provider's callback: ``{callback_url}`` in ``submit_body`` becomes a
    # per-task URL on this service (``GENHOOK_PUBLIC_BASE_URL`` must reach it).
    callback: bool = False

    @model_validator(mode="after")
    def _waiting(self) -> QueueProtocol:
        if self.callback and "{callback_url}" not in json.dumps(self.submit_body):
            raise ValueError("callback needs a '{callback_url}' value in submit_body")
        if not self.callback and self.status_path is None:
            raise ValueError("status_path is required unless callback is true")
        return self


class UpstreamModel(BaseModel):
    """One genhook model served by an upstream model server."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=200)
    kind: ModelKind = ModelKind.IMAGE
    adapter: Literal["openai-images", "queue"]
    base_url: str
    # The name of the environment variable holding the credential; never the value itself.
    credential_env: str | None = None
    auth_header: str = "Authorization"
    auth_scheme: str = "Bearer"
    # Redirects from the upstream: refused ("none"), or followed within the base URL's own
    # scheme, host and port ("same-origin"). Never to another origin.
    follow_redirects: Literal["none", "same-origin"] = "none"
    # The upstream's own model name, sent as ``model`` by the OpenAI-style adapter.
    upstream_model: str | None = None
    response_format: Literal["b64_json", "url"] = "b64_json"
    # Whether requests must carry 1 to 10 images like the edit request, or may carry none.
    images_required: bool = True
    timeout_seconds: float = Field(default=60.0, gt=0)
    retry_base_seconds: float = Field(default=0.5, gt=0)
    retry_cap_seconds: float = Field(default=10.0, gt=0)
    max_attempts: int = Field(default=5, ge=1)
    concurrency: int = Field(default=16, ge=1, le=4096)
    deadline_seconds: float = Field(default=300.0, gt=0)
    max_output_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    price_usd: Decimal = Field(default=Decimal("0"), ge=0)
    # JSON pointers into the final upstream response, when the upstream reports them.
    cost_pointer: str | None = None
    nsfw_pointer: str | None = None
    # Run genhook's NSFW detector on image outputs the upstream does not flag itself.
    detect_nsfw: bool = True
    queue: QueueProtocol | None = None
    description: str = ""

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("base_url must be an http(s) URL")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _adapter_settings(self) -> UpstreamModel:
        if self.adapter == "queue" and self.queue is None:
            raise ValueError("the queue adapter needs 'queue'")
        return self


def load_upstream_models(settings: Settings) -> list[UpstreamModel]:
    """Every configured upstream model; raises ``ValueError`` naming the bad entry and field."""
    entries = model_entries(
        settings.upstream_models, settings.upstream_models_file, "GENHOOK_UPSTREAM_MODELS_FILE"
    )
    models = []
    for index, entry in enumerate(entries):
        try:
            models.append(UpstreamModel.model_validate(entry))
        except ValidationError as exc:
            name = entry_name("upstream model", index, entry)
            raise ValueError(f"{name} is invalid: {validation_problems(exc)}") from None
    return models
