"""snapshots table (team-owned); sandboxes remember the snapshot they came from

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "snapshots",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("team", sa.String(128), sa.ForeignKey("teams.id"), nullable=False),
        sa.Column("name", sa.String(128), nullable=True),
        sa.Column("source_sandbox", sa.String(32), nullable=True),
        sa.Column("template", sa.String(128), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("vcpus", sa.Integer, nullable=False),
        sa.Column("memory_mb", sa.Integer, nullable=False),
        sa.Column("disk_mb", sa.Integer, nullable=True),
        sa.Column("size_bytes", sa.BigInteger, nullable=False),
        sa.Column("deleted_at", sa.Float, nullable=True),
    )
    op.create_index("ix_snapshots_team", "snapshots", ["team"])
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(sa.Column("snapshot", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("snapshot")
    op.drop_index("ix_snapshots_team", "snapshots")
    op.drop_table("snapshots")
