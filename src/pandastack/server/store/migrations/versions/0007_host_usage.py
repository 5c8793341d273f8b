"""hosts get what their agents report at each heartbeat (templates held, sandboxes, used
vCPUs and memory) and `fenced` (moved to an epoch no agent holds yet)

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.add_column(sa.Column("templates", sa.JSON, nullable=False,
                                   server_default=sa.text("'[]'")))
        for name in ("sandboxes", "used_vcpus", "used_memory_mb"):
            batch.add_column(sa.Column(name, sa.Integer, nullable=False,
                                       server_default=sa.text("0")))
        batch.add_column(sa.Column("fenced", sa.Boolean, nullable=False,
                                   server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        for name in ("fenced", "used_memory_mb", "used_vcpus", "sandboxes", "templates"):
            batch.drop_column(name)
