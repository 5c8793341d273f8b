"""volumes (team-owned, on one host), their attachments to sandboxes, and the attachments a
snapshot recorded

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "volumes",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("team", sa.String(128), sa.ForeignKey("teams.id"), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("size_mb", sa.Integer, nullable=False),
        sa.Column("host_id", sa.String(32), nullable=True),
        sa.Column("source_volume", sa.String(32), nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("deleted_at", sa.Float, nullable=True),
    )
    # A deleted volume's name may be taken again: unique among the live ones only.
    op.create_index("uq_volumes_team_name_live", "volumes", ["team", "name"], unique=True,
                    sqlite_where=sa.text("deleted_at IS NULL"),
                    postgresql_where=sa.text("deleted_at IS NULL"))
    op.create_table(
        "volume_attachments",
        sa.Column("volume_id", sa.String(32), primary_key=True),
        sa.Column("sandbox_id", sa.String(32), primary_key=True),
        sa.Column("mount_path", sa.Text, nullable=False),
        sa.Column("read_only", sa.Boolean, nullable=False),
    )
    op.create_index("ix_volume_attachments_sandbox", "volume_attachments", ["sandbox_id"])
    with op.batch_alter_table("snapshots") as batch:
        batch.add_column(sa.Column("volumes", sa.JSON, nullable=False,
                                   server_default=sa.text("'[]'")))


def downgrade() -> None:
    with op.batch_alter_table("snapshots") as batch:
        batch.drop_column("volumes")
    op.drop_index("ix_volume_attachments_sandbox", "volume_attachments")
    op.drop_table("volume_attachments")
    op.drop_index("uq_volumes_team_name_live", "volumes")
    op.drop_table("volumes")
