"""Persistence: SQLAlchemy models, repository functions and alembic migrations."""

from . import events as _events  # noqa: F401  (its tables and its flush hook)
from . import registry_credentials as _registry_credentials  # noqa: F401  (its table)
from .db import open_store
from .models import (
    ApiKey,
    Host,
    Lease,
    Sandbox,
    ServerSecret,
    Snapshot,
    Team,
    TemplateBlob,
    TemplateName,
    TemplateVersion,
    Volume,
    VolumeAttachment,
    VolumeBackup,
)
from .repo import Store

__all__ = ["ApiKey", "Host", "Lease", "Sandbox", "ServerSecret", "Snapshot", "Store", "Team",
           "TemplateBlob", "TemplateName", "TemplateVersion", "Volume", "VolumeAttachment",
           "VolumeBackup", "open_store"]
