"""the host API protocol each agent speaks: `hosts.protocol` and `hosts.oldest_protocol` (the
oldest API server level it serves); 1 for the rows of agents that predate them
(hostport/compat.py)

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.add_column(sa.Column("protocol", sa.Integer, nullable=False, server_default="1"))
        batch.add_column(sa.Column("oldest_protocol", sa.Integer, nullable=False,
                                   server_default="1"))


def downgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.drop_column("oldest_protocol")
        batch.drop_column("protocol")
