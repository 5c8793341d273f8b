"""initial schema: teams, api_keys, sandboxes

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "teams",
        sa.Column("id", sa.String(128), primary_key=True),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("team", sa.String(128), sa.ForeignKey("teams.id"), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False, unique=True),
        sa.Column("admin", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("revoked_at", sa.Float, nullable=True),
    )
    op.create_index("ix_api_keys_team", "api_keys", ["team"])
    op.create_table(
        "sandboxes",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("team", sa.String(128), sa.ForeignKey("teams.id"), nullable=False),
        sa.Column("template", sa.String(128), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=True),
        sa.Column("ttl_seconds", sa.Integer, nullable=False),
        sa.Column("persistent", sa.Boolean, nullable=False),
        sa.Column("vcpus", sa.Integer, nullable=False),
        sa.Column("memory_mb", sa.Integer, nullable=False),
        sa.Column("disk_mb", sa.Integer, nullable=True),
        sa.Column("env", sa.JSON, nullable=False),
        sa.Column("metadata", sa.JSON, nullable=False),
        sa.Column("last_activity_at", sa.Float, nullable=False),
        sa.Column("ended_at", sa.Float, nullable=True),
        sa.Column("end_reason", sa.Text, nullable=True),
    )
    op.create_index("ix_sandboxes_team_state", "sandboxes", ["team", "state"])
    op.create_index("ix_sandboxes_state", "sandboxes", ["state"])


def downgrade() -> None:
    op.drop_table("sandboxes")
    op.drop_index("ix_api_keys_team", "api_keys")
    op.drop_table("api_keys")
    op.drop_table("teams")
