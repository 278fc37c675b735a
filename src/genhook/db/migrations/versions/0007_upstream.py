"""upstream models: the provider's own cost on usage lines, and queue callbacks

Revision ID: 0007
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usage_lines") as batch:
        batch.add_column(sa.Column("upstream_cost_micros", sa.BigInteger(), nullable=True))
    op.create_table(
        "upstream_callbacks",
        sa.Column("task_id", sa.String(length=40), nullable=False),
        sa.Column("token", sa.String(length=64), nullable=False),
        sa.Column("body", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("received_at", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("task_id"),
    )


def downgrade() -> None:
    op.drop_table("upstream_callbacks")
    with op.batch_alter_table("usage_lines") as batch:
        batch.drop_column("upstream_cost_micros")
