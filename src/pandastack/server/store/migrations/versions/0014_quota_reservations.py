"""quota reservations: what a wake, restart, restore or hibernate has admitted before its
host call lands (`sandboxes.quota_hold`), what a volume's resize has admitted
(`volumes.reserved_mb`), and the limits on hibernated sandboxes and stored snapshots
(ADR 0025, addendum on reservations)

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("team_quotas") as batch:
        batch.add_column(sa.Column("max_hibernated", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("max_snapshot_gb", sa.Float(), nullable=True))
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(sa.Column("quota_hold", sa.String(16), nullable=True))
    with op.batch_alter_table("volumes") as batch:
        batch.add_column(sa.Column("reserved_mb", sa.Integer(), nullable=False,
                                   server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("volumes") as batch:
        batch.drop_column("reserved_mb")
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("quota_hold")
    with op.batch_alter_table("team_quotas") as batch:
        batch.drop_column("max_snapshot_gb")
        batch.drop_column("max_hibernated")
