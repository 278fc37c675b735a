"""Service configuration, read from ``GENHOOK_*`` environment variables.

Every field is documented in ``docs/configuration.md``; keep the two in step.
"""

from __future__ import annotations

import contextlib
import ipaddress
from datetime import timedelta
from decimal import Decimal
from functools import cached_property
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict


class ModelBatching(BaseModel):
    """How one model's calls are batched and run at once (``GENHOOK_MODEL_BATCHING``); an
    omitted field keeps the model's own value."""

    model_config = ConfigDict(extra="forbid")

    max_batch_size: int | None = Field(default=None, ge=1, le=256)
    max_wait_ms: int | None = Field(default=None, ge=0, le=60_000)
    concurrency: int | None = Field(default=None, ge=1, le=4096)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GENHOOK_", extra="ignore")

    data_dir: Path = Field(default=Path("genhook-data"))
    database_url: str | None = None
    public_base_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000

    # Workers: engines run in separate processes so CPU work never blocks the API loop.
    workers: int = Field(default=2, ge=0)
    # An idle worker is woken when a task is submitted or requeued (genhook.db.wakeups); this
    # slow poll is only the safety net.
    worker_poll_seconds: float = Field(default=5.0, gt=0)
    lease_seconds: float = Field(default=30.0, gt=0)
    max_lease_losses: int = Field(default=3, ge=1)
    sweep_interval_seconds: float = Field(default=1.0, gt=0)
    shutdown_grace_seconds: float = Field(default=20.0, ge=0)
    task_deadline_seconds: float | None = Field(default=None, gt=0)
    # The claim order across accounts: ``fair`` shares the workers by weight in worker time,
    # ``fifo`` takes the oldest task first (docs/scheduling.md).
    scheduling: Literal["fair", "fifo"] = "fair"
    # Process roles: dispatcher processes under `genhook serve`; tasks at once per worker for
    # engines that wait on I/O (0: each model's own); the worker and dispatcher health port.
    dispatchers: int = Field(default=1, ge=0)
    worker_concurrency: int = Field(default=0, ge=0)
    health_host: str = "127.0.0.1"
    health_port: int = Field(default=0, ge=0, le=65535)

    # A verified API key is remembered this long; a revocation takes effect within it.
    auth_cache_seconds: float = Field(default=2.0, ge=0)

    # Requests and inputs.
    max_body_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    input_max_bytes: int = Field(default=25 * 1024 * 1024, gt=0)
    input_fetch_timeout_seconds: float = Field(default=20.0, gt=0)
    max_input_pixels: int = Field(default=40_000_000, gt=0)
    # Pixels all input images of one task may declare together (docs/security.md).
    max_task_input_pixels: int = Field(default=100_000_000, gt=0)

    # Storage of inputs and outputs.
    storage: Literal["file", "database"] = "file"
    # Where ``file`` storage keeps blobs: a directory (default ``<data_dir>/blobs``) or an
    # S3-compatible bucket, ``s3://bucket/prefix`` (docs/operations.md#blob-storage).
    blob_store: str | None = None
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_addressing_style: Literal["auto", "path", "virtual"] = "auto"
    # Outputs in a bucket are streamed through the API, or answered with a redirect to a
    # presigned URL that lives this long.
    output_delivery: Literal["stream", "redirect"] = "stream"
    output_presign_seconds: int = Field(default=300, ge=1, le=7 * 24 * 3600)

    # Billing, in USD. Money is Decimal in code and integer micro-dollars in the database.
    price_tier_1_5k_usd: Decimal = Decimal("0.027")
    price_tier_2k_usd: Decimal = Decimal("0.030")
    price_extra_input_image_usd: Decimal = Decimal("0.003")

    # Target-address policy (webhook targets and input-image URLs).
    webhook_allow_private_targets: bool = False

    # Webhook delivery.
    webhook_signing: Literal["migration", "ed25519"] = "migration"
    webhook_header_brand: str = "Service"
    webhook_timeout_seconds: float = Field(default=10.0, gt=0)
    webhook_retry_base_seconds: float = Field(default=10.0, gt=0)
    webhook_retry_cap_seconds: float = Field(default=1800.0, gt=0)
    webhook_retry_max_attempts: int = Field(default=10, ge=1)
    webhook_key_overlap_days: float = Field(default=7.0, ge=0)
    webhook_encryption_key: str | None = None
    webhook_response_excerpt_bytes: int = Field(default=1024, ge=0)
    webhook_reconcile_interval_seconds: float = Field(default=30.0, gt=0)
    # An idle dispatcher is woken when a delivery is enqueued and looks again when the
    # earliest retry falls due; this slow poll is only the safety net.
    webhook_poll_seconds: float = Field(default=5.0, gt=0)
    # Attempts in flight at once, per delivery process.
    webhook_concurrency: int = Field(default=128, ge=1)
    # Extra CA certificates (PEM) trusted for webhook and input-image TLS, besides the
    # system store; for private PKI and tests.
    webhook_ca_file: Path | None = None
    # Fair delivery, per delivery process: attempts in flight per endpoint (an account's
    # URL without its query), the share of the senders one account may use, and a safety
    # limit on one account's attempts in flight to one host (scheme, host, port).
    webhook_destination_max_in_flight: int = Field(default=8, ge=1)
    webhook_account_share: float = Field(default=0.5, gt=0, le=1)
    webhook_host_max_in_flight: int = Field(default=64, ge=1)
    # Endpoint and host health: consecutive failures that open a circuit, and the first
    # cooldown before a half-open probe (doubling per reopening, capped at 5 minutes).
    webhook_breaker_failures: int = Field(default=5, ge=1)
    webhook_breaker_cooldown_seconds: float = Field(default=30.0, gt=0)
    # Also send Standard Webhooks headers (webhook-id, -timestamp, -signature) by default;
    # an account's own setting wins.
    webhook_standard_headers: bool = False

    # Image engine and moderation.
    nsfw_threshold: float = Field(default=0.7, ge=0, le=1)
    moderation_blocked_terms: list[str] = Field(default_factory=list)
    moderation_reject_nsfw_inputs: bool = True
    # When true, a small built-in list of blocked prompt terms applies on top of
    # ``moderation_blocked_terms`` (see docs/engines/image-edit.md).
    moderation_builtin_terms: bool = True

    # Audio models (docs/engines/text-to-speech.md, docs/engines/speech-to-text.md).
    price_tts_per_1k_chars_usd: Decimal = Decimal("0.015")
    price_stt_task_usd: Decimal = Decimal("0.006")
    # A CTranslate2 Whisper model directory; unset uses the bundled English-only tiny.en.
    stt_model_dir: Path | None = None
    stt_max_duration_seconds: float = Field(default=600.0, gt=0, le=4 * 3600)
    # CPU threads per worker process for speech-to-text; 0 shares the cores among workers.
    stt_cpu_threads: int = Field(default=0, ge=0)
    # 1 decodes greedily; more beams are a little more accurate and slower.
    stt_beam_size: int = Field(default=1, ge=1, le=10)
    # Batched, the seconds of audio one pass of the model takes at most (a batch with more
    # runs in several passes; a longer recording has a pass of its own).
    stt_max_batch_seconds: float = Field(default=240.0, gt=0)
    # Video model (genhook/image-to-video): price per second of output by resolution, and
    # the H.264 encoder's speed/size trade-off (see docs/engines/image-to-video.md).
    price_video_480p_per_second_usd: Decimal = Decimal("0.010")
    price_video_720p_per_second_usd: Decimal = Decimal("0.020")
    price_video_1080p_per_second_usd: Decimal = Decimal("0.040")
    video_deadline_seconds: float = Field(default=600.0, gt=0)
    video_encoder_preset: Literal[
        "ultrafast", "superfast", "veryfast", "faster", "fast", "medium"
    ] = "ultrafast"
    video_crf: int = Field(default=23, ge=0, le=51)
    video_encoder_threads: int = Field(default=1, ge=0)

    # Per model id: jobs per engine call, the wait for a batch to fill, and calls at once
    # per worker process, over the model's own values (docs/engines.md#batching), e.g.
    # ``{"genhook/speech-to-text": {"max_batch_size": 8, "max_wait_ms": 20}}``.
    model_batching: dict[str, ModelBatching] = Field(default_factory=dict)
    # Extra engines to register, as ``module:function`` names called with the registry.
    extra_engines: list[str] = Field(default_factory=list)

    # Waiting and watching: the longest ``Prefer: wait``, how often an API process looks for
    # changes of the tasks someone waits on, and how often a worker writes engine progress.
    wait_max_seconds: float = Field(default=60.0, ge=0, le=60)
    watch_poll_seconds: float = Field(default=0.1, gt=0)
    progress_interval_seconds: float = Field(default=0.25, gt=0)
    # How often a busy worker checks whether its task was canceled (a cheap indexed read).
    cancel_check_seconds: float = Field(default=1.0, gt=0)

    # Idempotent submit: an ``Idempotency-Key`` is remembered this long per account.
    idempotency_key_ttl_seconds: float = Field(default=86400.0, gt=0)

    # Per-account submit limits, enforced in the database across api processes; 0 turns a
    # limit off. ``genhook accounts limits`` overrides them per account.
    rate_limit_per_second: float = Field(default=0.0, ge=0)
    # Submits a quiet account may send at once; 0 means one second's worth (at least 1).
    rate_limit_burst: int = Field(default=0, ge=0)
    max_tasks_in_flight: int = Field(default=0, ge=0)

    # Output retention: outputs are deleted this long after their task ends (seconds or
    # ISO 8601, e.g. ``P7D``); the job runs next to webhook reconciliation.
    output_retention: timedelta = Field(default=timedelta(days=7))
    retention_interval_seconds: float = Field(default=60.0, gt=0)
    retention_batch: int = Field(default=200, ge=1)
    # Models served by upstream model servers (docs/engines/upstream.md): a JSON list of
    # model entries, and/or a JSON file holding one.
    upstream_models: list[dict[str, Any]] = Field(default_factory=list)
    upstream_models_file: Path | None = None
    # Models served by a predictor class (docs/engines/your-model.md): a ``genhook.model``
    # ``Model`` or a Cog project; a JSON list of entries and/or a JSON file holding one.
    models: list[dict[str, Any]] = Field(default_factory=list)
    models_file: Path | None = None
    # Models served from diffusers pipeline directories on this machine
    # (docs/engines/local-models.md): a JSON list of entries and/or a JSON file holding one;
    # the device a worker runs them on (``genhook worker --device``); the memory they may take
    # together per device, in GiB (0: the card's memory less a tenth; no limit on the CPU);
    # how long a task waits for a worker that has its model loaded before another loads it;
    # and the models a worker loads before it claims anything (``genhook worker --preload``).
    local_models: list[dict[str, Any]] = Field(default_factory=list)
    local_models_file: Path | None = None
    local_models_device: str = "auto"
    local_models_memory_gb: float = Field(default=0.0, ge=0)
    local_models_affinity_seconds: float = Field(default=2.0, ge=0)
    # CPU threads of a local model's calls (and, on the CPU, of its NSFW checks); 0 shares
    # the process's usable cores among the workers.
    local_models_cpu_threads: int = Field(default=0, ge=0)
    # LoRA adapters by URL in a request (docs/engines/local-models.md#lora-adapters): off
    # unless enabled; each file at most this many MB, fetched under the address policy and
    # kept by content hash in ``<data_dir>/loras`` within this many MB.
    local_models_lora_urls: bool = False
    local_models_lora_url_max_mb: float = Field(default=512.0, gt=0)
    local_models_lora_cache_mb: float = Field(default=4096.0, gt=0)
    preload_models: list[str] = Field(default_factory=list)
    # The models a worker claims (``genhook worker --model``): one pool of workers per model
    # group, each scaled on its own queue. Empty: every registered model.
    worker_models: list[str] = Field(default_factory=list)
    # Faults (docs/operations.md): storage and database errors are retried this long before a
    # task is requeued; a task is started only with at least this long left before its
    # deadline (or its model's recent run time, when longer).
    fault_retry_seconds: float = Field(default=10.0, ge=0)
    task_start_margin_seconds: float = Field(default=0.5, ge=0)
    # Submits are refused (503) while the data directory's disk has less free than this, so
    # tasks in flight keep room to store their outputs; the sweeper holds off meanwhile.
    min_free_disk_mb: int = Field(default=256, ge=0)
    # A request waits this long for a database connection, then gets 503.
    db_pool_timeout_seconds: float = Field(default=2.0, gt=0)
    db_connect_timeout_seconds: float = Field(default=5.0, gt=0)
    # API requests in progress at once in one process; more are refused with 503.
    max_concurrent_requests: int = Field(default=512, ge=1)
    # Of those, event streams and ``Prefer: wait`` requests open at once per account and per
    # API key; more are refused with 429 (docs/security.md).
    max_held_requests_per_account: int = Field(default=64, ge=1)
    max_held_requests_per_key: int = Field(default=32, ge=1)
    # History kept: webhook attempts, and finished tasks (None keeps them).
    webhook_attempt_retention_days: float = Field(default=30.0, gt=0)
    task_retention_days: float | None = Field(default=None, gt=0)
    # Hardening: request bodies and connections (see docs/security.md).
    # The cap on a body's JSON apart from its base64 image data, and on any other body.
    max_json_bytes: int = Field(default=256 * 1024, gt=0)
    max_json_depth: int = Field(default=32, ge=1)
    max_json_containers: int = Field(default=1000, ge=1)
    # Time a client has to send a request's headers, and then its body.
    header_timeout_seconds: float = Field(default=10.0, gt=0)
    body_timeout_seconds: float = Field(default=60.0, gt=0)
    keep_alive_seconds: int = Field(default=5, ge=1)
    # Open connections at once; more are answered 503 and closed.
    max_connections: int = Field(default=1000, ge=1)
    # Decode work per input image: progressive JPEG scans, PNG chunks.
    max_decode_scans: int = Field(default=100, ge=1)
    max_decode_chunks: int = Field(default=10_000, ge=1)

    log_level: str = "INFO"
    # ``json``: one JSON object per line, with the task and delivery ids (docs/operations.md).
    log_format: Literal["text", "json"] = "text"
    # Metrics (docs/operations.md#metrics): where every process of a machine writes its
    # counts (``genhook serve`` uses one under the data directory when unset), a bearer
    # token ``/metrics`` asks for (unset: open, for a private network), and how long a
    # scrape waits for the database's queue and outbox figures.
    metrics_dir: Path | None = None
    metrics_token: str | None = None
    metrics_database_timeout_seconds: float = Field(default=2.0, gt=0)
    # Per-account queue gauges in /metrics: the N accounts with the most waiting tasks by
    # id, the rest as ``other``; 0 (the default) shows no account at all.
    metrics_accounts: int = Field(default=0, ge=0, le=1000)

    # Web console (/console); its sessions are kept in the database (docs/console.md).
    console_enabled: bool = True
    # /docs and /redoc, from assets in the package (docs/security.md).
    api_docs: bool = True
    # Accounts whose keys see every account's tasks and deliveries (/api/v1/admin/...).
    admin_accounts: list[str] = Field(default_factory=list)
    # Addresses or networks of reverse proxies whose X-Forwarded-For/-Proto are believed;
    # empty: the connection's own address is the client's, whatever headers it sends.
    trusted_proxies: list[str] = Field(default_factory=list)

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        """Each entry an address or a network, so a typo fails at start, not silently."""
        for entry in value:
            try:
                ipaddress.ip_network(entry.strip(), strict=False)
            except ValueError:
                raise ValueError(f"{entry!r} is not an IP address or network") from None
        return [entry.strip() for entry in value]

    @field_validator("output_retention", mode="before")
    @classmethod
    def _seconds_or_iso(cls, value: object) -> object:
        """``GENHOOK_OUTPUT_RETENTION=3600`` means seconds; ISO 8601 (``P7D``) also works."""
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return timedelta(seconds=float(value))
        return value

    @field_validator("blob_store")
    @classmethod
    def _blob_store(cls, value: str | None, info: ValidationInfo) -> str | None:
        """A bucket URL names its bucket: a typo fails at start, not at the first upload."""
        if value and info.data.get("storage") == "database":
            raise ValueError("GENHOOK_BLOB_STORE cannot be combined with GENHOOK_STORAGE=database")
        if value and value.startswith("s3:"):
            parts = urlsplit(value)
            if not parts.netloc or parts.query or parts.fragment:
                raise ValueError(f"expected s3://bucket/prefix, got {value!r}")
        return value or None

    @cached_property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite+aiosqlite:///{(self.data_dir / 'genhook.db').resolve()}"

    @cached_property
    def resolved_public_base_url(self) -> str:
        if self.public_base_url:
            return self.public_base_url.rstrip("/")
        return f"http://{self.host}:{self.port}"


def model_entries(inline: list[dict[str, Any]], file: Path | None, variable: str) -> list[Any]:
    """The entries of a models setting (``GENHOOK_*_MODELS``) followed by those of its
    ``*_FILE`` (a JSON list, or one object); ``variable`` names that file's setting in the
    ``ValueError`` of a file that cannot be read."""
    entries: list[Any] = list(inline)
    if file is not None:
        import json

        try:
            loaded = json.loads(file.read_text())
        except OSError as exc:
            raise ValueError(f"{variable}: {file}: {exc.strerror or exc}") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{variable}: {file} is not valid JSON: {exc}") from None
        entries.extend(loaded if isinstance(loaded, list) else [loaded])
    return entries


def entry_name(what: str, index: int, entry: Any) -> str:
    """How a start-up error names entry ``index`` (0-based) of a models setting: its
    position counted from 1, as a person counts, and its id when it has one."""
    ident = entry.get("id") if isinstance(entry, dict) else None
    named = f" ({ident})" if isinstance(ident, str) and ident else ""
    return f"{what} entry {index + 1}{named}"


def validation_problems(exc: ValidationError) -> str:
    """pydantic's errors as one line, ``field: message; ...``, without its help links."""
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        problems.append(f"{where}: {message}" if where else message)
    return "; ".join(problems)
