"""usage segments (what each team held, and when) and team quotas

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "usage_segments",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("team", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("subject_id", sa.String(64), nullable=False),
        sa.Column("sandbox_id", sa.String(32), nullable=True),
        sa.Column("template", sa.String(128), nullable=True),
        sa.Column("vcpus", sa.Integer, nullable=False),
        sa.Column("memory_mb", sa.Integer, nullable=False),
        sa.Column("gib", sa.Float, nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("ended_at", sa.Float, nullable=True),
    )
    op.create_index("ix_usage_segments_team_started", "usage_segments", ["team", "started_at"])
    op.create_index("ix_usage_segments_subject", "usage_segments", ["subject_id"])
    op.create_table(
        "team_quotas",
        sa.Column("team", sa.String(128), sa.ForeignKey("teams.id"), primary_key=True),
        sa.Column("max_sandboxes", sa.Integer, nullable=True),
        sa.Column("max_vcpus", sa.Integer, nullable=True),
        sa.Column("max_memory_mb", sa.Integer, nullable=True),
        sa.Column("max_volume_gb", sa.Float, nullable=True),
        sa.Column("monthly_budget_usd", sa.Float, nullable=True),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    # No segment is made for sandboxes running across this upgrade: when they started to hold
    # what they hold is recorded nowhere. 0010 meters them (and volumes, snapshots) from its
    # own upgrade.


def downgrade() -> None:
    op.drop_table("team_quotas")
    op.drop_index("ix_usage_segments_subject", "usage_segments")
    op.drop_index("ix_usage_segments_team_started", "usage_segments")
    op.drop_table("usage_segments")
