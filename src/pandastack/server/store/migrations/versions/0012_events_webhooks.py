"""the event log, webhooks and their delivery queue

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("team", sa.String(128), nullable=False),
        sa.Column("type", sa.String(48), nullable=False),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("actor", sa.String(64), nullable=False),
        sa.Column("sandbox_id", sa.String(32), nullable=True),
        sa.Column("template", sa.String(160), nullable=True),
        sa.Column("data", sa.JSON, nullable=False),
        # Ids are never reused, also after the newest rows are pruned: they are SSE ids.
        sqlite_autoincrement=True,
    )
    op.create_index("ix_events_team_id", "events", ["team", "id"])
    op.create_index("ix_events_time", "events", ["time"])
    op.create_table(
        "webhooks",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("team", sa.String(128), nullable=False),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("events", sa.JSON, nullable=False),
        sa.Column("description", sa.String(256), nullable=True),
        sa.Column("secret", sa.String(128), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_webhooks_team", "webhooks", ["team"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("webhook_id", sa.String(32), nullable=False),
        sa.Column("team", sa.String(128), nullable=False),
        sa.Column("event_id", sa.Integer, nullable=True),
        sa.Column("event_type", sa.String(48), nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("next_attempt_at", sa.Float, nullable=True),
        sa.Column("finished_at", sa.Float, nullable=True),
        sa.Column("response_status", sa.Integer, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_webhook_deliveries_due", "webhook_deliveries",
                    ["status", "next_attempt_at"])
    op.create_index("ix_webhook_deliveries_webhook", "webhook_deliveries", ["webhook_id", "id"])
    op.create_table(
        "event_marks",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("value", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("event_marks")
    op.drop_index("ix_webhook_deliveries_webhook", "webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_due", "webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_index("ix_webhooks_team", "webhooks")
    op.drop_table("webhooks")
    op.drop_index("ix_events_time", "events")
    op.drop_index("ix_events_team_id", "events")
    op.drop_table("events")
