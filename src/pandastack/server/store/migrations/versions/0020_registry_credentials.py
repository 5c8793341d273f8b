"""registry_credentials table: a team's credentials per image registry, the password sealed
with the operator's key (server/registries/sealing.py)

Revision ID: 0020
Revises: 0019
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "registry_credentials",
        sa.Column("team", sa.String(128), sa.ForeignKey("teams.id"), primary_key=True),
        sa.Column("registry", sa.String(255), primary_key=True),
        sa.Column("username", sa.String(256), nullable=False),
        sa.Column("secret", sa.Text, nullable=False),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("registry_credentials")
