"""sandboxes by name: a team's name for a sandbox, unique among those that have not ended

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

LIVE = "name IS NOT NULL AND ended_at IS NULL"


def upgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(sa.Column("name", sa.String(128), nullable=True))
    op.create_index("uq_sandboxes_team_name_live", "sandboxes", ["team", "name"], unique=True,
                    sqlite_where=sa.text(LIVE), postgresql_where=sa.text(LIVE))


def downgrade() -> None:
    op.drop_index("uq_sandboxes_team_name_live", "sandboxes")
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("name")
