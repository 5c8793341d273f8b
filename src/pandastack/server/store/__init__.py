"""Persistence: SQLAlchemy models, repository functions and alembic migrations."""

from .db import open_store
from .models import ApiKey, Sandbox, Team
from .repo import Store

__all__ = ["ApiKey", "Sandbox", "Store", "Team", "open_store"]
