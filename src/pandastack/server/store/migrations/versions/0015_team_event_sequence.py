"""each team its own event sequence: `events.seq` (1, 2, 3, ... per team) and the teams'
counters (`event_sequences`); existing events are numbered per team in id order, and the
webhook deliveries of events still in the log name the event by its new number
(ADR 0035, addendum on team sequences)

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

_BATCH = 1000


def _renumber(conn: sa.Connection) -> dict[int, int]:
    """Each team's events numbered 1, 2, 3, ... in id order: {id: seq}."""
    seqs: dict[int, int] = {}
    last: dict[str, int] = {}
    for event_id, team in conn.execute(sa.text("SELECT id, team FROM events ORDER BY id")):
        last[team] = last.get(team, 0) + 1
        seqs[int(event_id)] = last[team]
    pairs = [{"i": i, "s": s} for i, s in seqs.items()]
    for start in range(0, len(pairs), _BATCH):
        conn.execute(sa.text("UPDATE events SET seq = :s WHERE id = :i"),
                     pairs[start:start + _BATCH])
    if last:
        conn.execute(sa.text("INSERT INTO event_sequences (team, last) VALUES (:t, :n)"),
                     [{"t": t, "n": n} for t, n in last.items()])
    return seqs


def _renumber_deliveries(conn: sa.Connection, seqs: dict[int, int]) -> None:
    """A delivery's `event_id` and, while it is still to be sent, its body's `id` become the
    team's number (the body is signed when it is sent, not when it was queued)."""
    rows = conn.execute(sa.text("SELECT id, event_id, status, body FROM webhook_deliveries "
                                "WHERE event_id IS NOT NULL")).all()
    for delivery_id, event_id, status, body in rows:
        seq = seqs.get(int(event_id))
        if seq is None:  # its event was pruned: the delivery is history, left as it was
            continue
        values: dict[str, object] = {"d": delivery_id, "s": seq, "b": body}
        if status == "pending":
            data = json.loads(body)
            data["id"] = seq
            values["b"] = json.dumps(data, separators=(",", ":"))
        conn.execute(sa.text("UPDATE webhook_deliveries SET event_id = :s, body = :b "
                             "WHERE id = :d"), values)


def upgrade() -> None:
    op.create_table(
        "event_sequences",
        sa.Column("team", sa.String(128), primary_key=True),
        sa.Column("last", sa.BigInteger, nullable=False),
    )
    # Added in place, not by a batch copy: SQLite's copy of the table would start a new
    # AUTOINCREMENT counter, and ids past a pruned newest one would be handed out again
    # (below the fan-out mark: never delivered). The default only fills the column here.
    op.add_column("events", sa.Column("seq", sa.BigInteger, nullable=False,
                                      server_default="0"))
    conn = op.get_bind()
    seqs = _renumber(conn)
    _renumber_deliveries(conn, seqs)
    if conn.dialect.name == "postgresql":  # SQLite cannot drop a default in place
        op.alter_column("events", "seq", server_default=None)
    op.create_index("ix_events_team_seq", "events", ["team", "seq"], unique=True)


def downgrade() -> None:
    # Deliveries keep the numbers they have: a downgraded server only lists them (its
    # fan-out goes by the global id, kept in event_marks).
    op.drop_index("ix_events_team_seq", "events")
    op.drop_column("events", "seq")
    op.drop_table("event_sequences")
