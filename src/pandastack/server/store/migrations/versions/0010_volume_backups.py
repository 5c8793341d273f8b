"""volume backups in the object store, and the state of a volume's move between hosts

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "volume_backups",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("team", sa.String(128), sa.ForeignKey("teams.id"), nullable=False),
        sa.Column("volume_id", sa.String(32), nullable=False),
        sa.Column("volume_name", sa.String(128), nullable=False),
        sa.Column("size_mb", sa.Integer, nullable=False),
        sa.Column("stored_bytes", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("deleted_at", sa.Float, nullable=True),
    )
    op.create_index("ix_volume_backups_team", "volume_backups", ["team"])
    with op.batch_alter_table("volumes") as batch:
        batch.add_column(sa.Column("moving_to", sa.String(32), nullable=True))
        batch.add_column(sa.Column("moving_from", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("volumes") as batch:
        batch.drop_column("moving_from")
        batch.drop_column("moving_to")
    op.drop_index("ix_volume_backups_team", "volume_backups")
    op.drop_table("volume_backups")
