"""per container: which kind of claim it uses, ours (ElasticGPUClaim) or DRA's (ResourceClaim) (issue 48)

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add allocations.claim_kind; every row before this revision was an ElasticGPUClaim's."""
    with op.batch_alter_table("allocations") as batch:
        batch.add_column(sa.Column("claim_kind", sa.String(32), nullable=False, server_default="ElasticGPUClaim"))


def downgrade() -> None:
    """Drop allocations.claim_kind, and the rows of ResourceClaims with it: an older agent would take them for
    ElasticGPUClaims (and publish them in runningClaims, write their usage into a claim of the same name)."""
    op.execute("DELETE FROM allocations WHERE claim_kind != 'ElasticGPUClaim'")
    with op.batch_alter_table("allocations") as batch:
        batch.drop_column("claim_kind")
