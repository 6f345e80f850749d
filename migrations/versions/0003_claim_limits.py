"""per container: whether it reads the claim's limits file, the size asked and the size in effect (issue 17)

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add allocations.limits_file, requested_cores/memory_mib, applied_cores/memory_mib and limits_changed_at."""
    with op.batch_alter_table("allocations") as batch:
        # Rows of containers created before this revision had no limits file mounted: false.
        batch.add_column(sa.Column("limits_file", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("requested_cores", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("requested_memory_mib", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("applied_cores", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("applied_memory_mib", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("limits_changed_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    """Drop the limits columns (allocation rows are kept; their sizes at creation stay in cores/memory_mib)."""
    with op.batch_alter_table("allocations") as batch:
        for column in ("limits_changed_at", "applied_memory_mib", "applied_cores", "requested_memory_mib",
                       "requested_cores", "limits_file"):  # fmt: skip
            batch.drop_column(column)
