"""the ExposedPorts of the image a template version was built FROM:
`template_versions.exposed_ports` (a JSON list such as ["8080/tcp"]; None FROM a template)

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("template_versions") as batch:
        batch.add_column(sa.Column("exposed_ports", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("template_versions") as batch:
        batch.drop_column("exposed_ports")
