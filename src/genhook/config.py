"""Service configuration, read from ``GENHOOK_*`` environment variables.

Every field is documented in ``docs/configuration.md``; keep the two in step.
"""

from __future__ import annotations

from decimal import Decimal
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GENHOOK_", extra="ignore")

    data_dir: Path = Field(default=Path("genhook-data"))
    database_url: str | None = None
    public_base_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000

    # Workers: engines run in separate processes so CPU work never blocks the API loop.
    workers: int = Field(default=2, ge=0)
    worker_poll_seconds: float = Field(default=0.05, gt=0)
    lease_seconds: float = Field(default=30.0, gt=0)
    max_lease_losses: int = Field(default=3, ge=1)
    sweep_interval_seconds: float = Field(default=1.0, gt=0)
    shutdown_grace_seconds: float = Field(default=30.0, ge=0)
    task_deadline_seconds: float | None = Field(default=None, gt=0)

    # A verified API key is remembered this long; a revocation takes effect within it.
    auth_cache_seconds: float = Field(default=2.0, ge=0)

    # Requests and inputs.
    max_body_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    input_max_bytes: int = Field(default=25 * 1024 * 1024, gt=0)
    input_fetch_timeout_seconds: float = Field(default=20.0, gt=0)
    max_input_pixels: int = Field(default=40_000_000, gt=0)

    # Storage of inputs and outputs.
    storage: Literal["file", "database"] = "file"

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
    # How often an idle dispatcher looks for due deliveries written by other processes.
    webhook_poll_seconds: float = Field(default=0.02, gt=0)
    # Attempts in flight at once, per delivery process.
    webhook_concurrency: int = Field(default=128, ge=1)
    # Claim, sign and record in a helper process, so the dispatcher's event loop only sends.
    webhook_feed_process: bool = True
    # Extra CA certificates (PEM) trusted for webhook and input-image TLS, besides the
    # system store; for private PKI and tests.
    webhook_ca_file: Path | None = None
    # Fair delivery: attempts in flight per destination (scheme, host, port) and the share
    # of the senders one account may use, per delivery process.
    webhook_destination_max_in_flight: int = Field(default=8, ge=1)
    webhook_account_share: float = Field(default=0.5, gt=0, le=1)
    # Destination health: consecutive failures that open its circuit, and the first
    # cooldown before a half-open probe (doubling per reopening, capped at 5 minutes).
    webhook_breaker_failures: int = Field(default=5, ge=1)
    webhook_breaker_cooldown_seconds: float = Field(default=30.0, gt=0)
    # Also send Standard Webhooks headers (webhook-id, -timestamp, -signature) by default;
    # an account's own setting wins.
    webhook_standard_headers: bool = False

    # Image engine and moderation.
    nsfw_threshold: float = Field(default=0.6, ge=0, le=1)
    moderation_blocked_terms: list[str] = Field(default_factory=list)
    moderation_reject_nsfw_inputs: bool = True
    # When true, a small built-in list of blocked prompt terms applies on top of
    # ``moderation_blocked_terms`` (see docs/engines/image-edit.md).
    moderation_builtin_terms: bool = True

    # Extra engines to register, as ``module:function`` names called with the registry.
    extra_engines: list[str] = Field(default_factory=list)

    log_level: str = "INFO"

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
