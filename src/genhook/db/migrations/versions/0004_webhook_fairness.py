"""webhook fairness, destination health, Standard Webhooks, replays and progress events

Revision ID: 0004
Revises: 0001
Create Date: 2026-11-22 21:55:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# SQLite reflects the old unnamed UNIQUE (task_id); this convention names it so that batch
# mode can drop it. PostgreSQL named it itself.
_NAMING = {"uq": "uq_%(table_name)s_%(column_0_name)s"}


def _old_unique() -> str:
    if op.get_bind().dialect.name == "postgresql":
        return "webhook_deliveries_task_id_key"
    return "uq_webhook_deliveries_task_id"


def upgrade() -> None:
    with op.batch_alter_table("accounts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("standard_webhooks", sa.Boolean(), nullable=True))
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("webhook_events", sa.String(length=64), nullable=True))
    with op.batch_alter_table(
        "webhook_deliveries", schema=None, naming_convention=_NAMING
    ) as batch_op:
        batch_op.add_column(sa.Column("destination", sa.String(length=300), nullable=True))
        batch_op.drop_constraint(_old_unique(), type_="unique")
        batch_op.create_unique_constraint("uq_deliveries_task_event", ["task_id", "event_type"])
    _backfill_destinations()
    op.create_table(
        "webhook_replays",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("delivery_id", sa.String(length=64), nullable=False),
        sa.Column("first_attempt", sa.Integer(), nullable=False),
        sa.Column("bulk", sa.Boolean(), nullable=False),
        sa.Column("requested_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["delivery_id"], ["webhook_deliveries.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("webhook_replays", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_webhook_replays_delivery_id"), ["delivery_id"], unique=False
        )
    op.create_table(
        "webhook_destinations",
        sa.Column("destination", sa.String(length=300), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("consecutive_failures", sa.Integer(), nullable=False),
        sa.Column("opened_at", sa.BigInteger(), nullable=True),
        sa.Column("retry_at", sa.BigInteger(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("destination"),
    )


def _backfill_destinations() -> None:
    """Pending deliveries get their destination, so claims and workers agree on lanes."""
    from genhook.sender.fairness import destination_of

    bind = op.get_bind()
    rows = bind.execute(
        sa.text("SELECT id, url FROM webhook_deliveries WHERE status = 'pending'")
    ).all()
    for delivery_id, url in rows:
        bind.execute(
            sa.text("UPDATE webhook_deliveries SET destination = :d WHERE id = :i"),
            {"d": destination_of(url), "i": delivery_id},
        )


def downgrade() -> None:
    op.drop_table("webhook_destinations")
    with op.batch_alter_table("webhook_replays", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_webhook_replays_delivery_id"))
    op.drop_table("webhook_replays")
    with op.batch_alter_table("webhook_deliveries", schema=None) as batch_op:
        batch_op.drop_constraint("uq_deliveries_task_event", type_="unique")
        batch_op.create_unique_constraint("webhook_deliveries_task_id_key", ["task_id"])
        batch_op.drop_column("destination")
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_column("webhook_events")
    with op.batch_alter_table("accounts", schema=None) as batch_op:
        batch_op.drop_column("standard_webhooks")
