"""each team its own webhook delivery numbers: `webhook_deliveries.seq` (1, 2, 3, ... per
team: `X-Pandastack-Delivery` and the delivery log's `id`) and the teams' counters
(`webhook_delivery_sequences`); existing deliveries are numbered per team in id order
(ADR 0035, addendum on delivery numbers)

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_BATCH = 1000


def _renumber(conn: sa.Connection) -> None:
    last: dict[str, int] = {}
    pairs: list[dict[str, int]] = []
    for delivery_id, team in conn.execute(sa.text(
            "SELECT id, team FROM webhook_deliveries ORDER BY id")):
        last[team] = last.get(team, 0) + 1
        pairs.append({"i": int(delivery_id), "s": last[team]})
    for start in range(0, len(pairs), _BATCH):
        conn.execute(sa.text("UPDATE webhook_deliveries SET seq = :s WHERE id = :i"),
                     pairs[start:start + _BATCH])
    if last:
        conn.execute(sa.text("INSERT INTO webhook_delivery_sequences (team, last) "
                             "VALUES (:t, :n)"), [{"t": t, "n": n} for t, n in last.items()])


def upgrade() -> None:
    op.create_table(
        "webhook_delivery_sequences",
        sa.Column("team", sa.String(128), primary_key=True),
        sa.Column("last", sa.BigInteger, nullable=False),
    )
    # In place, not by a batch copy (which would restart SQLite's AUTOINCREMENT counter);
    # the default only fills the column here.
    op.add_column("webhook_deliveries", sa.Column("seq", sa.BigInteger, nullable=False,
                                                  server_default="0"))
    conn = op.get_bind()
    _renumber(conn)
    if conn.dialect.name == "postgresql":  # SQLite cannot drop a default in place
        op.alter_column("webhook_deliveries", "seq", server_default=None)
    op.drop_index("ix_webhook_deliveries_webhook", "webhook_deliveries")
    op.create_index("ix_webhook_deliveries_webhook_seq", "webhook_deliveries",
                    ["webhook_id", "seq"])
    op.create_index("ix_webhook_deliveries_team_seq", "webhook_deliveries", ["team", "seq"],
                    unique=True)


def downgrade() -> None:
    op.drop_index("ix_webhook_deliveries_team_seq", "webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_webhook_seq", "webhook_deliveries")
    op.create_index("ix_webhook_deliveries_webhook", "webhook_deliveries", ["webhook_id", "id"])
    op.drop_column("webhook_deliveries", "seq")
    op.drop_table("webhook_delivery_sequences")
