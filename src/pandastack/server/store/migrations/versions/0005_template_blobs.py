"""template_blobs: a build's spec and logs move out of template_versions (whose rows are read
on every create from a team template); template_names keeps each name's newest version
number, so that pruned versions never have their numbers reused

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "template_blobs",
        # no foreign key: see models.TemplateBlob
        sa.Column("build_id", sa.String(32), primary_key=True),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("logs", sa.Text, nullable=True),
    )
    op.create_table(
        "template_names",
        sa.Column("team", sa.String(128), sa.ForeignKey("teams.id"), primary_key=True),
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("last_version", sa.Integer, nullable=False),
    )
    # In SQL, so that a fat row (up to ~96 MiB of spec) is never loaded into the server.
    op.execute("INSERT INTO template_blobs (build_id, spec, logs) "
               "SELECT id, spec, logs FROM template_versions")
    op.execute("INSERT INTO template_names (team, name, last_version) "
               "SELECT team, name, MAX(version) FROM template_versions GROUP BY team, name")
    with op.batch_alter_table("template_versions") as batch:
        batch.drop_column("spec")
        batch.drop_column("logs")
    op.create_index("ix_template_versions_status", "template_versions", ["status"])
    op.create_index("ix_template_versions_deleted_at", "template_versions", ["deleted_at"])


def downgrade() -> None:
    op.drop_index("ix_template_versions_deleted_at", "template_versions")
    op.drop_index("ix_template_versions_status", "template_versions")
    with op.batch_alter_table("template_versions") as batch:
        batch.add_column(sa.Column("spec", sa.JSON, nullable=False, server_default="{}"))
        batch.add_column(sa.Column("logs", sa.Text, nullable=True))
    op.execute("UPDATE template_versions SET "
               "spec = (SELECT spec FROM template_blobs WHERE build_id = template_versions.id), "
               "logs = (SELECT logs FROM template_blobs WHERE build_id = template_versions.id) "
               "WHERE id IN (SELECT build_id FROM template_blobs)")
    op.drop_table("template_names")
    op.drop_table("template_blobs")
