"""MIG instances the agent created for claims (issue 26): one row per instance, two-phase

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the mig_instances table."""
    op.create_table(
        "mig_instances",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("card_uuid", sa.String(64), nullable=False),
        sa.Column("elastic_gpu", sa.String(253), nullable=False, unique=True),
        sa.Column("profile", sa.String(32), nullable=False),
        sa.Column("start", sa.Integer(), nullable=False),
        sa.Column("gpu_instance_id", sa.Integer(), nullable=True),
        sa.Column("mig_uuid", sa.String(64), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=True),
        # Two instances never start at one memory slice of one card.
        sa.UniqueConstraint("card_uuid", "start", name="uq_mig_instances_card_start"),
    )


def downgrade() -> None:
    """Drop the mig_instances table (the instances themselves stay on the cards)."""
    op.drop_table("mig_instances")
