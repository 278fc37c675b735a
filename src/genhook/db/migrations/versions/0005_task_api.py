"""task API: cancel, idempotent submit, limits, start deadlines, output retention

Revision ID: 0005
Revises: 0001
Create Date: 2026-11-22 22:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tasks", sa.Column("start_deadline_at", sa.BigInteger(), nullable=True))
    op.add_column("tasks", sa.Column("outputs_expire_at", sa.BigInteger(), nullable=True))
    op.add_column("tasks", sa.Column("outputs_purged_at", sa.BigInteger(), nullable=True))
    op.create_index("ix_tasks_account_status", "tasks", ["account_id", "status"])
    op.create_index("ix_tasks_status_start_deadline", "tasks", ["status", "start_deadline_at"])
    op.create_index("ix_tasks_outputs_expire", "tasks", ["outputs_purged_at", "outputs_expire_at"])
    op.create_table(
        "idempotency_keys",
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("task_id", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"]),
        sa.PrimaryKeyConstraint("account_id", "key"),
    )
    op.create_index("ix_idempotency_keys_expires_at", "idempotency_keys", ["expires_at"])
    op.create_table(
        "account_limits",
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("submits_per_second", sa.Float(), nullable=True),
        sa.Column("submit_burst", sa.Integer(), nullable=True),
        sa.Column("max_in_flight", sa.Integer(), nullable=True),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("tokens_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"]),
        sa.PrimaryKeyConstraint("account_id"),
    )
    op.create_table(
        "expired_outputs",
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("task_id", sa.String(length=64), nullable=False),
        sa.Column("expired_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )


def downgrade() -> None:
    op.drop_table("expired_outputs")
    op.drop_table("account_limits")
    op.drop_index("ix_idempotency_keys_expires_at", table_name="idempotency_keys")
    op.drop_table("idempotency_keys")
    op.drop_index("ix_tasks_outputs_expire", table_name="tasks")
    op.drop_index("ix_tasks_status_start_deadline", table_name="tasks")
    op.drop_index("ix_tasks_account_status", table_name="tasks")
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("outputs_purged_at")
        batch.drop_column("outputs_expire_at")
        batch.drop_column("start_deadline_at")
