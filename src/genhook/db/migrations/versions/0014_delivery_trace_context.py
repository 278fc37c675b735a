"""webhook_deliveries.trace_context: the task's W3C traceparent, copied when the row is written

With tracing on, each delivery attempt is a span in its task's trace. The dispatcher read
the task's context once per task before every first attempt; carried in the delivery row, it
arrives with the claim instead. Deliveries still pending get their task's context now.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("webhook_deliveries") as batch:
        batch.add_column(sa.Column("trace_context", sa.String(length=64), nullable=True))
    op.execute(
        "UPDATE webhook_deliveries SET trace_context = "
        "(SELECT trace_context FROM tasks WHERE tasks.id = webhook_deliveries.task_id) "
        "WHERE status = 'pending'"
    )


def downgrade() -> None:
    with op.batch_alter_table("webhook_deliveries") as batch:
        batch.drop_column("trace_context")
