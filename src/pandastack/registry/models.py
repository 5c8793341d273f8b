"""The registry's tables: hosts and leases. Times are UNIX seconds of the database's clock.

`Base` is the declarative base of every table of the store: the server's models
(`pandastack.server.store.models`) derive from it too, so that one metadata describes the
whole schema the migrations make (server/store/migrations, written by hand)."""

from __future__ import annotations

from sqlalchemy import JSON, Boolean, Float, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Host(Base):
    """A host agent. Capacity is what it has; usage (templates, sandboxes, used_*) is what it
    reported at its last heartbeat. `fenced`: moved to an epoch no agent holds yet (its next
    registration starts another). `protocol` / `oldest_protocol`: its host API level and the
    oldest API server level it serves (hostport/compat.py); 1 for agents that predate them."""

    __tablename__ = "hosts"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    endpoint: Mapped[str] = mapped_column(Text, unique=True)
    vcpus: Mapped[int] = mapped_column(Integer)
    memory_mb: Mapped[int] = mapped_column(Integer)
    disk_mb: Mapped[int] = mapped_column(Integer)
    labels: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    version: Mapped[str] = mapped_column(String(64))
    epoch: Mapped[int] = mapped_column(Integer)
    last_heartbeat_at: Mapped[float] = mapped_column(Float)
    draining: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[float] = mapped_column(Float)
    templates: Mapped[list[str]] = mapped_column(JSON, default=list)
    sandboxes: Mapped[int] = mapped_column(Integer, default=0)
    used_vcpus: Mapped[int] = mapped_column(Integer, default=0)
    used_memory_mb: Mapped[int] = mapped_column(Integer, default=0)
    fenced: Mapped[bool] = mapped_column(Boolean, default=False)
    protocol: Mapped[int] = mapped_column(Integer, server_default="1")
    oldest_protocol: Mapped[int] = mapped_column(Integer, server_default="1")


class Lease(Base):
    """The host that runs a sandbox, under the host's epoch when it took the lease."""

    __tablename__ = "leases"
    __table_args__ = (Index("ix_leases_host_epoch", "host_id", "epoch"),)

    # No foreign keys: a later batch migration of sandboxes or hosts recreates that table on
    # SQLite (see the server's TemplateBlob). The queries keep them consistent.
    sandbox_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    host_id: Mapped[str] = mapped_column(String(32))
    epoch: Mapped[int] = mapped_column(Integer)
    renewed_at: Mapped[float] = mapped_column(Float)
