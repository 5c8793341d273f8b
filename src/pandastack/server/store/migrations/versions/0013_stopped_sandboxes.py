"""stopped sandboxes: why a persistent sandbox's VM ended, and how it came back (ADR 0037)

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(sa.Column("stop_reason", sa.Text(), nullable=True))
        batch.add_column(sa.Column("restored_from", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("restored_from")
        batch.drop_column("stop_reason")
