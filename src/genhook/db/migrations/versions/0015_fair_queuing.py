"""Fair sharing of the workers across accounts, and priorities within an account

``tasks.priority`` orders an account's own waiting tasks (1 high, 0 normal, -1 low);
``api_keys.max_priority`` bounds what a key may ask for. ``tasks.fair_tag`` is a task's
virtual start tag and ``tasks.fair_cost`` the virtual time charged for it, from the
account's clock in ``account_clocks``; ``account_limits.weight`` is the account's share
(docs/scheduling.md). Tasks already waiting keep tag 0, so they go first, oldest first.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("priority", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("fair_tag", sa.BigInteger(), nullable=False, server_default="0"))
        batch.add_column(
            sa.Column("fair_cost", sa.BigInteger(), nullable=False, server_default="0")
        )
    op.create_index("ix_tasks_status_tag", "tasks", ["status", "fair_tag"])
    op.create_index(
        "ix_tasks_account_queue",
        "tasks",
        ["account_id", "status", sa.desc(sa.column("priority")), "created_at"],
    )
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("max_priority", sa.Integer(), nullable=True))
    with op.batch_alter_table("account_limits") as batch:
        batch.add_column(sa.Column("weight", sa.Integer(), nullable=True))
    op.create_table(
        "account_clocks",
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("finish", sa.BigInteger(), nullable=False),
        sa.Column("used_ms", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"]),
        sa.PrimaryKeyConstraint("account_id"),
    )


def downgrade() -> None:
    op.drop_table("account_clocks")
    with op.batch_alter_table("account_limits") as batch:
        batch.drop_column("weight")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("max_priority")
    op.drop_index("ix_tasks_account_queue", table_name="tasks")
    op.drop_index("ix_tasks_status_tag", table_name="tasks")
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("fair_cost")
        batch.drop_column("fair_tag")
        batch.drop_column("priority")
