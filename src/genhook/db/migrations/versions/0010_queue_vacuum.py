"""vacuum and analyze the queue tables early (PostgreSQL)

A claim walks its queue's index from the head (``ix_tasks_status_available``,
``ix_deliveries_status_next``). The entries of rows claimed since the last vacuum stay there,
dead, and each claim steps over them; with the default thresholds (20% of the table) a table
holding weeks of finished tasks collects hundreds of thousands before autovacuum comes. These
tables are vacuumed after 1% of their rows (at least 1,000) changed and analyzed after 2%, so
the dead entries stay few and the planner's statistics follow the backlog. SQLite has no
autovacuum of this kind: nothing to do there.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

QUEUE_TABLES = ("tasks", "webhook_deliveries")
QUEUE_STORAGE = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_analyze_scale_factor": "0.02",
    "autovacuum_analyze_threshold": "1000",
}


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    settings = ", ".join(f"{name} = {value}" for name, value in QUEUE_STORAGE.items())
    for table in QUEUE_TABLES:
        op.execute(f"ALTER TABLE {table} SET ({settings})")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in QUEUE_TABLES:
        op.execute(f"ALTER TABLE {table} RESET ({', '.join(QUEUE_STORAGE)})")
