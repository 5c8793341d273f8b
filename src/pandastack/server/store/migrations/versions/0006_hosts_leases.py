"""hosts (the host agents, their capacity and fencing epoch) and leases (which host runs a
sandbox, under which epoch); sandboxes get a host_id for placement

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hosts",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("endpoint", sa.Text, nullable=False, unique=True),
        sa.Column("vcpus", sa.Integer, nullable=False),
        sa.Column("memory_mb", sa.Integer, nullable=False),
        sa.Column("disk_mb", sa.Integer, nullable=False),
        sa.Column("labels", sa.JSON, nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("epoch", sa.Integer, nullable=False),
        sa.Column("last_heartbeat_at", sa.Float, nullable=False),
        sa.Column("draining", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "leases",
        # No foreign keys (as template_blobs): a later batch migration of sandboxes or hosts
        # recreates that table on SQLite. The repo keeps them consistent.
        sa.Column("sandbox_id", sa.String(32), primary_key=True),
        sa.Column("host_id", sa.String(32), nullable=False),
        sa.Column("epoch", sa.Integer, nullable=False),
        sa.Column("renewed_at", sa.Float, nullable=False),
    )
    op.create_index("ix_leases_host_epoch", "leases", ["host_id", "epoch"])
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(sa.Column("host_id", sa.String(32), nullable=True))
    op.create_index("ix_sandboxes_host_id", "sandboxes", ["host_id"])


def downgrade() -> None:
    op.drop_index("ix_sandboxes_host_id", "sandboxes")
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("host_id")
    op.drop_index("ix_leases_host_epoch", "leases")
    op.drop_table("leases")
    op.drop_table("hosts")
