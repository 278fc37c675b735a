"""Tables. Times are integer epoch milliseconds (UTC) so both databases compare them the
same way and the webhook body's ``created_at`` needs no conversion; money is integer
micro-dollars."""

from __future__ import annotations

from typing import Any, ClassVar, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, MappedColumn, mapped_column


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON}


class Account(Base):
    __tablename__ = "accounts"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    signing_secret: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[int] = mapped_column(BigInteger)
    # Also send the Standard Webhooks headers; None follows GENHOOK_WEBHOOK_STANDARD_HEADERS.
    standard_webhooks: Mapped[bool | None] = mapped_column(Boolean, nullable=True)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    # The first characters of the key, shown in listings so a person can tell keys apart.
    prefix: Mapped[str] = mapped_column(String(20))
    # SHA-256 of the whole key; keys are 256-bit random, so a fast hash is safe here.
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    revoked_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # The highest task priority the key may ask for (1 high, 0 normal, -1 low); None: any.
    max_priority: Mapped[int | None] = mapped_column(Integer, nullable=True)


class Task(Base):
    __tablename__ = "tasks"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    model: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(16))
    # created | processing | completed | failed | timeout | canceled (genhook.task_states)
    status: Mapped[str] = mapped_column(String(16))
    # Validated request without images; images live in ``inputs``.
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    # One entry per input image: {"url": ...} or {"blob": key, "format": ...}.
    inputs: Mapped[list[Any]] = mapped_column(JSON)
    webhook_url: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Opt-in webhook events besides ``terminal`` (comma-separated, e.g. "processing").
    webhook_events: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[int] = mapped_column(BigInteger)
    available_at: Mapped[int] = mapped_column(BigInteger)
    deadline_at: Mapped[int] = mapped_column(BigInteger)
    started_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    finished_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_losses: Mapped[int] = mapped_column(Integer, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(100), nullable=True)
    lease_expires_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # Output blob keys and their NSFW flags, filled on completion.
    outputs: Mapped[list[Any]] = mapped_column(JSON, default=list)
    has_nsfw_contents: Mapped[list[Any]] = mapped_column(JSON, default=list)
    info: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # The structured transcript of a completed speech-to-text task.
    stt_result: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # The price fixed at submit (tier, lines, total micro-dollars), billed only on completion.
    charge: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    error_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error_message: Mapped[str | None] = mapped_column(Text, nullable=True)
    # A task still waiting at this time ends ``timeout`` without running (X-Start-Deadline).
    start_deadline_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # Set at the terminal transition; the retention job deletes the outputs after it.
    outputs_expire_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    outputs_purged_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # The W3C traceparent of the submit request's span, when traced (genhook.tracing): how
    # the worker and the dispatcher continue the task's trace in their own processes.
    trace_context: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # Order among the account's own waiting tasks: 1 high, 0 normal, -1 low (docs/scheduling.md).
    priority: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Fair queuing (docs/scheduling.md): the task's virtual start tag, in virtual
    # microseconds of weighted worker time, which orders the claims across accounts; and the
    # virtual time its account was charged for it at submit, corrected when it ends.
    fair_tag: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    fair_cost: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")

    __table_args__ = (
        Index("ix_tasks_account_created", "account_id", "created_at"),
        # The fair claim walks the waiting tasks by tag, then takes the head account's
        # highest-priority oldest task.
        Index("ix_tasks_status_tag", "status", "fair_tag"),
        Index(
            "ix_tasks_account_queue",
            "account_id",
            "status",
            cast("MappedColumn[int]", priority).column.desc(),
            "created_at",
        ),
        # Tasks in flight per account (the in-flight limit counts them at every submit).
        Index("ix_tasks_account_status", "account_id", "status"),
        Index("ix_tasks_status_start_deadline", "status", "start_deadline_at"),
        Index("ix_tasks_outputs_expire", "outputs_purged_at", "outputs_expire_at"),
        Index("ix_tasks_status_available", "status", "available_at"),
        Index("ix_tasks_status_lease", "status", "lease_expires_at"),
        Index("ix_tasks_status_deadline", "status", "deadline_at"),
        # The webhook reconciliation sweeper scans recently finished tasks only.
        Index("ix_tasks_finished", "finished_at"),
    )


class UsageLine(Base):
    __tablename__ = "usage_lines"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    # No foreign key: the billing ledger outlives tasks pruned after their retention.
    task_id: Mapped[str] = mapped_column(String(64), unique=True)
    model: Mapped[str] = mapped_column(String(200))
    tier: Mapped[str] = mapped_column(String(20))
    output_pixels: Mapped[int] = mapped_column(Integer)
    input_images: Mapped[int] = mapped_column(Integer)
    lines: Mapped[list[Any]] = mapped_column(JSON)
    amount_micros: Mapped[int] = mapped_column(BigInteger)
    # What an upstream provider reported charging for the task (operator cost, not billed).
    upstream_cost_micros: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_usage_account_created", "account_id", "created_at"),)


class Blob(Base):
    """Blob bytes, for the ``database`` storage backend (shared by every machine)."""

    __tablename__ = "blobs"

    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    content_type: Mapped[str] = mapped_column(String(100))
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[int] = mapped_column(BigInteger)


class SigningKey(Base):
    """Ed25519 webhook signing keys; the private key is encrypted at rest."""

    __tablename__ = "signing_keys"

    kid: Mapped[str] = mapped_column(String(64), primary_key=True)
    # active | rotated (still published until ``retire_at``) | retired
    status: Mapped[str] = mapped_column(String(16))
    public_x: Mapped[str] = mapped_column(String(64))
    private_key_encrypted: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[int] = mapped_column(BigInteger)
    rotated_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    retire_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class WebhookDelivery(Base):
    """Transactional outbox row: written in the same transaction as the terminal state."""

    __tablename__ = "webhook_deliveries"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id"))
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    url: Mapped[str] = mapped_column(Text)
    # ``scheme://host:port`` of the URL: its host, the unit of connection health.
    destination: Mapped[str | None] = mapped_column(String(300), nullable=True)
    # The URL without its query: the unit of fairness and of endpoint health.
    endpoint: Mapped[str | None] = mapped_column(String(2000), nullable=True)
    event_type: Mapped[str] = mapped_column(String(64))
    # The exact body bytes; every attempt sends these same bytes.
    body: Mapped[bytes] = mapped_column(LargeBinary)
    # pending | delivered | undeliverable
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # ``attempts`` when the current retry budget began (0, or the count at a redelivery).
    round_start: Mapped[int] = mapped_column(Integer, default=0)
    redeliveries: Mapped[int] = mapped_column(Integer, default=0)
    # While claimed, ``next_attempt_at`` equals ``lease_expires_at``: a delivery whose
    # sender died becomes due again by itself when the lease runs out.
    next_attempt_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    lease_owner: Mapped[str | None] = mapped_column(String(100), nullable=True)
    lease_expires_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    last_status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[int] = mapped_column(BigInteger)
    delivered_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    last_attempt_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # The task's W3C traceparent when traced: each attempt's span continues the task's trace.
    trace_context: Mapped[str | None] = mapped_column(String(64), nullable=True)

    __table_args__ = (
        Index("ix_deliveries_status_next", "status", "next_attempt_at"),
        Index("ix_deliveries_status_lease", "status", "lease_expires_at"),
        Index("ix_deliveries_account_created", "account_id", "created_at"),
        # One delivery per task and event (terminal, processing); also finds a task's
        # other events for the ordering rule.
        UniqueConstraint("task_id", "event_type", name="uq_deliveries_task_event"),
    )


class WebhookAttempt(Base):
    __tablename__ = "webhook_attempts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    delivery_id: Mapped[str] = mapped_column(ForeignKey("webhook_deliveries.id"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[int] = mapped_column(BigInteger)
    duration_ms: Mapped[int] = mapped_column(Integer)
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    response_excerpt: Mapped[str | None] = mapped_column(Text, nullable=True)
    kid: Mapped[str | None] = mapped_column(String(64), nullable=True)


class TaskEvent(Base):
    """Progress and log lines an engine reported while running a task, in order; the
    result's ``progress`` and ``logs`` and the event stream read them."""

    __tablename__ = "task_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id"))
    # 0 to 1, when this event reports progress.
    progress: Mapped[float | None] = mapped_column(Float, nullable=True)
    # One short log line, when this event carries one.
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_task_events_task", "task_id", "id"),)


class IdempotencyKey(Base):
    """A submit's ``Idempotency-Key``: the primary key makes parallel retries collide in the
    database, so exactly one of them creates the task."""

    __tablename__ = "idempotency_keys"

    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    # SHA-256 of the submit path and the canonical JSON body.
    request_hash: Mapped[str] = mapped_column(String(64))
    task_id: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[int] = mapped_column(BigInteger, index=True)


class AccountLimit(Base):
    """Per-account limit overrides and the submit token bucket, one row per limited account.

    The bucket lives here, not in a process, so every api process draws on the same tokens.
    """

    __tablename__ = "account_limits"

    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    # Overrides of the settings; None uses the setting, 0 means unlimited.
    submits_per_second: Mapped[float | None] = mapped_column(Float, nullable=True)
    submit_burst: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_in_flight: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The account's share of the workers relative to others (fair queuing); None means 1.
    weight: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tokens: Mapped[float] = mapped_column(Float, default=0.0)
    tokens_at: Mapped[int] = mapped_column(BigInteger, default=0)


class AccountClock(Base):
    """An account's virtual clock of fair queuing (docs/scheduling.md): where its next
    task's tag starts, and the worker time its tasks actually used."""

    __tablename__ = "account_clocks"

    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    # The virtual finish of the account's last submitted task (virtual microseconds).
    finish: Mapped[int] = mapped_column(BigInteger, default=0)
    # Worker milliseconds its ended tasks held a worker, in all (the usage share).
    used_ms: Mapped[int] = mapped_column(BigInteger, default=0)
    updated_at: Mapped[int] = mapped_column(BigInteger, default=0)


class ExpiredOutput(Base):
    """An output deleted by retention, so its URL answers 410 rather than 404."""

    __tablename__ = "expired_outputs"

    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    task_id: Mapped[str] = mapped_column(String(64))
    expired_at: Mapped[int] = mapped_column(BigInteger)


class UpstreamCallback(Base):
    """A callback an upstream queue will send for a task: the token its URL carries, then
    the body it sent, read by the worker waiting on that task."""

    __tablename__ = "upstream_callbacks"

    task_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    token: Mapped[str] = mapped_column(String(64))
    body: Mapped[Any | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    received_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class ConsoleSession(Base):
    """A signed-in console session. The cookie holds a random token; this row holds its
    SHA-256 and the API key sealed with a key derived from the token, so neither a copied
    row nor a copied cookie alone acts as the key, and deleting the row (sign-out, the
    key's revocation) ends the session everywhere."""

    __tablename__ = "console_sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_id: Mapped[str] = mapped_column(String(40), index=True)
    account_id: Mapped[str] = mapped_column(String(40))
    sealed_key: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[int] = mapped_column(BigInteger)


class WebhookReplay(Base):
    """A redelivery: attempts numbered from ``first_attempt`` on are replays."""

    __tablename__ = "webhook_replays"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    delivery_id: Mapped[str] = mapped_column(ForeignKey("webhook_deliveries.id"), index=True)
    first_attempt: Mapped[int] = mapped_column(Integer)
    bulk: Mapped[bool] = mapped_column(Boolean)
    requested_at: Mapped[int] = mapped_column(BigInteger)


class WebhookDestination(Base):
    """The health of one account's endpoint or host as a delivery worker last saw it
    (circuit breaker); each account's own, so one account never sees another's."""

    __tablename__ = "webhook_destinations"

    account_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    # The endpoint (URL without its query) or ``scheme://host:port``, per ``scope``.
    target: Mapped[str] = mapped_column(String(2000), primary_key=True)
    # endpoint (HTTP-level failures) | host (connection-level failures)
    scope: Mapped[str] = mapped_column(String(16))
    # closed | open | half_open
    state: Mapped[str] = mapped_column(String(16))
    consecutive_failures: Mapped[int] = mapped_column(Integer)
    opened_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # While open: when the next half-open probe may go.
    retry_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    updated_at: Mapped[int] = mapped_column(BigInteger)
