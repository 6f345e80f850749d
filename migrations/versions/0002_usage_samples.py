"""usage samples (per process, per card, attributed), and when an allocation was released

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add allocations.released_at and the usage_samples table."""
    with op.batch_alter_table("allocations") as batch:
        batch.add_column(sa.Column("released_at", sa.DateTime(timezone=True), nullable=True))
    # Rows released before this revision (or across a downgrade and upgrade, which drops the
    # column) have no release time, and pruning (`released_at < cutoff`) would keep them forever.
    # They were released at the latest now: they are pruned one retention period from now.
    allocations = sa.table("allocations", sa.column("state", sa.String()),
                           sa.column("released_at", sa.DateTime(timezone=True)))  # fmt: skip
    op.execute(
        allocations.update()
        .where(allocations.c.state == "released", allocations.c.released_at.is_(None))
        .values(released_at=datetime.now(UTC))
    )
    op.create_table(
        "usage_samples",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("taken_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("gpu_uuid", sa.String(64), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("memory_mib", sa.Integer(), nullable=False),
        sa.Column("sm_percent", sa.Integer(), nullable=True),
        sa.Column("container_id", sa.String(128), nullable=True),
        sa.Column("claim_namespace", sa.String(253), nullable=True),
        sa.Column("claim_name", sa.String(253), nullable=True),
    )
    op.create_index("ix_usage_samples_taken_at", "usage_samples", ["taken_at"])


def downgrade() -> None:
    """Drop the usage samples and allocations.released_at (allocation rows are kept)."""
    op.drop_index("ix_usage_samples_taken_at", table_name="usage_samples")
    op.drop_table("usage_samples")
    with op.batch_alter_table("allocations") as batch:
        batch.drop_column("released_at")
