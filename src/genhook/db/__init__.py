"""Relational storage: SQLAlchemy models, the database handle and Alembic migrations."""

from genhook.db.database import Database, now_ms
from genhook.db.models import (
    Account,
    AccountClock,
    AccountLimit,
    ApiKey,
    Base,
    Blob,
    ExpiredOutput,
    IdempotencyKey,
    SigningKey,
    Task,
    TaskEvent,
    UsageLine,
    WebhookAttempt,
    WebhookDelivery,
    WebhookDestination,
    WebhookReplay,
)

__all__ = [
    "Account",
    "AccountClock",
    "AccountLimit",
    "ApiKey",
    "Base",
    "Blob",
    "Database",
    "ExpiredOutput",
    "IdempotencyKey",
    "SigningKey",
    "Task",
    "TaskEvent",
    "UsageLine",
    "WebhookAttempt",
    "WebhookDelivery",
    "WebhookDestination",
    "WebhookReplay",
    "now_ms",
]
