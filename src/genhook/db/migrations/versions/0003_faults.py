"""Usage lines outlive their tasks: drop the usage_lines -> tasks foreign key.

Finished tasks are pruned after ``GENHOOK_TASK_RETENTION_DAYS``; the billing ledger must stay.

Revision ID: 0003
Revises: 0001
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0001"
branch_labels = None
depends_on = None

# SQLite's foreign keys are unnamed: batch mode names them by this convention on reflection.
_CONVENTION = {"fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s"}


def _name() -> str:
    if op.get_bind().dialect.name == "postgresql":
        return "usage_lines_task_id_fkey"
    return "fk_usage_lines_task_id_tasks"


def upgrade() -> None:
    with op.batch_alter_table("usage_lines", naming_convention=_CONVENTION) as batch_op:
        batch_op.drop_constraint(_name(), type_="foreignkey")


def downgrade() -> None:
    with op.batch_alter_table("usage_lines", naming_convention=_CONVENTION) as batch_op:
        batch_op.create_foreign_key(_name(), "tasks", ["task_id"], ["id"])
