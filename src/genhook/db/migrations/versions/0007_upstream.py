"""usage lines record the upstream provider's own cost

Revision ID: 0007
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usage_lines") as batch:
        batch.add_column(sa.Column("upstream_cost_micros", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage_lines") as batch:
        batch.drop_column("upstream_cost_micros")
