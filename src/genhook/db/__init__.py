"""Relational storage: SQLAlchemy models, the database handle and Alembic migrations."""

from genhook.db.database import Database, now_ms
from genhook.db.models import (
    Account,
    ApiKey,
    Base,
    Blob,
    SigningKey,
    Task,
    UsageLine,
    WebhookAttempt,
    WebhookDelivery,
    WebhookDestination,
    WebhookReplay,
)

__all__ = [
    "Account",
    "ApiKey",
    "Base",
    "Blob",
    "Database",
    "SigningKey",
    "Task",
    "UsageLine",
    "WebhookAttempt",
    "WebhookDelivery",
    "WebhookDestination",
    "WebhookReplay",
    "now_ms",
]
