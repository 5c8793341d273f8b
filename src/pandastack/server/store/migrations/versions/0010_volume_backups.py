"""volume backups in the object store, and the state of a volume's move between hosts; what
was held across the upgrade to 0009 is metered from this one

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "volume_backups",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("team", sa.String(128), sa.ForeignKey("teams.id"), nullable=False),
        sa.Column("volume_id", sa.String(32), nullable=False),
        sa.Column("volume_name", sa.String(128), nullable=False),
        sa.Column("size_mb", sa.Integer, nullable=False),
        sa.Column("stored_bytes", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("deleted_at", sa.Float, nullable=True),
    )
    op.create_index("ix_volume_backups_team", "volume_backups", ["team"])
    with op.batch_alter_table("volumes") as batch:
        batch.add_column(sa.Column("moving_to", sa.String(32), nullable=True))
        batch.add_column(sa.Column("moving_from", sa.String(32), nullable=True))
    meter_what_0009_left_out(time.time())


SEGMENTS = sa.table("usage_segments", sa.column("team"), sa.column("kind"),
                    sa.column("subject_id"), sa.column("sandbox_id"), sa.column("template"),
                    sa.column("vcpus"), sa.column("memory_mb"), sa.column("gib"),
                    sa.column("started_at"), sa.column("ended_at"))
SANDBOXES = sa.table("sandboxes", sa.column("id"), sa.column("team"), sa.column("template"),
                     sa.column("state"), sa.column("vcpus"), sa.column("memory_mb"),
                     sa.column("disk_mb"))
VOLUMES = sa.table("volumes", sa.column("id"), sa.column("team"), sa.column("size_mb"),
                   sa.column("deleted_at"))
SNAPSHOTS = sa.table("snapshots", sa.column("id"), sa.column("team"), sa.column("template"),
                     sa.column("source_sandbox"), sa.column("size_bytes"),
                     sa.column("deleted_at"))
DEFAULT_DISK_MB = 2048  # store/usage.py: the built-in templates' rootfs


def meter_what_0009_left_out(now: float) -> None:
    """0009 opened no segment for what already held resources (a running sandbox, a volume,
    a snapshot): it was metered only from its next state change, or never. Each such thing
    without an open segment of its kind gets one from now (its time before stays unknown)."""
    bind = op.get_bind()

    def open_kinds(kind: str) -> set[str]:
        return set(bind.execute(sa.select(SEGMENTS.c.subject_id).where(
            SEGMENTS.c.kind == kind, SEGMENTS.c.ended_at.is_(None))).scalars())

    rows: list[dict[str, object]] = []
    for kind, states in (("compute", ("running", "paused")),
                         ("disk", ("running", "paused", "hibernated"))):
        metered = open_kinds(kind)
        for sbx in bind.execute(sa.select(SANDBOXES).where(SANDBOXES.c.state.in_(states))):
            if sbx.id in metered:
                continue
            compute = kind == "compute"
            rows.append({"team": sbx.team, "kind": kind, "subject_id": sbx.id,
                         "sandbox_id": sbx.id, "template": sbx.template,
                         "vcpus": sbx.vcpus if compute else 0,
                         "memory_mb": sbx.memory_mb if compute else 0,
                         "gib": 0.0 if compute else (sbx.disk_mb or DEFAULT_DISK_MB) / 1024,
                         "started_at": now, "ended_at": None})
    metered = open_kinds("volume")
    for vol in bind.execute(sa.select(VOLUMES).where(VOLUMES.c.deleted_at.is_(None))):
        if vol.id not in metered:
            rows.append({"team": vol.team, "kind": "volume", "subject_id": vol.id,
                         "sandbox_id": None, "template": None, "vcpus": 0, "memory_mb": 0,
                         "gib": vol.size_mb / 1024, "started_at": now, "ended_at": None})
    metered = open_kinds("snapshot")
    for snap in bind.execute(sa.select(SNAPSHOTS).where(SNAPSHOTS.c.deleted_at.is_(None))):
        if snap.id not in metered:
            rows.append({"team": snap.team, "kind": "snapshot", "subject_id": snap.id,
                         "sandbox_id": snap.source_sandbox, "template": snap.template,
                         "vcpus": 0, "memory_mb": 0, "gib": snap.size_bytes / (1 << 30),
                         "started_at": now, "ended_at": None})
    if rows:
        bind.execute(sa.insert(SEGMENTS), rows)


def downgrade() -> None:
    with op.batch_alter_table("volumes") as batch:
        batch.drop_column("moving_from")
        batch.drop_column("moving_to")
    op.drop_index("ix_volume_backups_team", "volume_backups")
    op.drop_table("volume_backups")
