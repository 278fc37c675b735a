"""webhook health per account and endpoint: deliveries' endpoint, health rows per account

Fairness and health move from the host (``scheme://host:port``) to the endpoint (the URL
without its query) of one account, with a host-level circuit kept for connection failures.
Pending deliveries get their endpoint, so claims and workers agree on lanes. The health
table is rebuilt keyed by account and target: its rows are what workers last saw, relearned
within an attempt or two, so the old per-host rows are not carried over.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("webhook_deliveries", schema=None) as batch_op:
        batch_op.add_column(sa.Column("endpoint", sa.String(length=2000), nullable=True))
    _backfill_endpoints()
    op.drop_table("webhook_destinations")
    op.create_table(
        "webhook_destinations",
        sa.Column("account_id", sa.String(length=64), nullable=False),
        sa.Column("target", sa.String(length=2000), nullable=False),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("consecutive_failures", sa.Integer(), nullable=False),
        sa.Column("opened_at", sa.BigInteger(), nullable=True),
        sa.Column("retry_at", sa.BigInteger(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("account_id", "target"),
    )


def _backfill_endpoints() -> None:
    from genhook.sender.fairness import endpoint_of

    bind = op.get_bind()
    rows = bind.execute(
        sa.text("SELECT id, url FROM webhook_deliveries WHERE status = 'pending'")
    ).all()
    for delivery_id, url in rows:
        bind.execute(
            sa.text("UPDATE webhook_deliveries SET endpoint = :e WHERE id = :i"),
            {"e": endpoint_of(url), "i": delivery_id},
        )


def downgrade() -> None:
    op.drop_table("webhook_destinations")
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
    with op.batch_alter_table("webhook_deliveries", schema=None) as batch_op:
        batch_op.drop_column("endpoint")
