"""Alembic environment: always run programmatically with a connection handed in by
`pandastack.server.store.db.migrate` (there is no alembic.ini)."""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from pandastack.server.store.models import Base

connection = context.config.attributes.get("connection")
if not isinstance(connection, Connection):
    raise RuntimeError("pandastack migrations must be run through store.db.migrate()")
context.configure(connection=connection, target_metadata=Base.metadata,
                  render_as_batch=connection.dialect.name == "sqlite")
with context.begin_transaction():
    context.run_migrations()
