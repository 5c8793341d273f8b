"""template_versions table (team templates, versioned); sandboxes keep the WORKDIR and USER
of their template as command defaults

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "template_versions",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("team", sa.String(128), sa.ForeignKey("teams.id"), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("snapshot_id", sa.String(64), nullable=True),
        sa.Column("env", sa.JSON, nullable=False),
        sa.Column("cwd", sa.Text, nullable=True),
        sa.Column("user", sa.String(64), nullable=True),
        sa.Column("vcpus", sa.Integer, nullable=True),
        sa.Column("memory_mb", sa.Integer, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("logs", sa.Text, nullable=True),
        sa.Column("steps_total", sa.Integer, nullable=True),
        sa.Column("steps_cached", sa.Integer, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("finished_at", sa.Float, nullable=True),
        sa.Column("deleted_at", sa.Float, nullable=True),
        sa.UniqueConstraint("team", "name", "version", name="uq_template_versions_version"),
    )
    op.create_index("ix_template_versions_team_name", "template_versions", ["team", "name"])
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(sa.Column("cwd", sa.Text, nullable=True))
        batch.add_column(sa.Column("user", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("user")
        batch.drop_column("cwd")
    op.drop_index("ix_template_versions_team_name", "template_versions")
    op.drop_table("template_versions")
