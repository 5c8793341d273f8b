"""what a sandbox's TTL ends in: `sandboxes.on_expiry` (None: it ends; "hibernate": it is
hibernated and kept, E2B's autoPause)

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(sa.Column("on_expiry", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("on_expiry")
