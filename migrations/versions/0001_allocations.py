"""allocations: one row per injection of cards into a container (started, created, released)

Revision ID: 0001
Revises:
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the allocations table."""
    op.create_table(
        "allocations",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("container_id", sa.String(128), nullable=True, unique=True),
        sa.Column("pod_uid", sa.String(64), nullable=False),
        sa.Column("pod_namespace", sa.String(253), nullable=False),
        sa.Column("pod_name", sa.String(253), nullable=False),
        sa.Column("container_name", sa.String(253), nullable=False),
        sa.Column("claim_namespace", sa.String(253), nullable=False),
        sa.Column("claim_name", sa.String(253), nullable=False),
        sa.Column("elastic_gpu", sa.String(253), nullable=False),
        sa.Column("gpu_uuids", sa.JSON(), nullable=False),
        sa.Column("cores", sa.Integer(), nullable=False),
        sa.Column("memory_mib", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_allocations_state", "allocations", ["state"])


def downgrade() -> None:
    """Drop the allocations table (and everything the ledger knew)."""
    op.drop_index("ix_allocations_state", table_name="allocations")
    op.drop_table("allocations")
