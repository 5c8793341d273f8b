"""Persistence: SQLAlchemy models, repository functions and alembic migrations."""

from .db import open_store
from .models import ApiKey, Sandbox, Snapshot, Team
from .repo import Store

__all__ = ["ApiKey", "Sandbox", "Snapshot", "Store", "Team", "open_store"]
