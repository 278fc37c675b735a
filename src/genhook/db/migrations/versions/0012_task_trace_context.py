"""tasks.trace_context: the submit request's W3C traceparent, when traced

The worker and the dispatcher run in other processes than the submit; with tracing on
(``genhook.tracing``) they continue the task's trace from this column. NULL when untraced.

Revision ID: 0012
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("trace_context", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("trace_context")
