"""template quota: the limit on the bytes a team's template versions store
(`team_quotas.max_template_gb`) and what each version stores or, while it builds, reserved
(`template_versions.size_bytes`; versions of before count 0 until they are rebuilt)

Revision ID: 0021
Revises: 0020
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("team_quotas") as batch:
        batch.add_column(sa.Column("max_template_gb", sa.Float(), nullable=True))
    with op.batch_alter_table("template_versions") as batch:
        batch.add_column(sa.Column("size_bytes", sa.BigInteger(), nullable=False,
                                   server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("template_versions") as batch:
        batch.drop_column("size_bytes")
    with op.batch_alter_table("team_quotas") as batch:
        batch.drop_column("max_template_gb")
