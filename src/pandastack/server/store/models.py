"""Tables. Times are UNIX seconds (float), as on the wire."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

# The hosts and leases are the registry's (agents use them without the server); every table
# shares its declarative base, so that one metadata is the whole schema.
from pandastack.registry.models import Base, Host, Lease

__all__ = ["ApiKey", "Base", "Host", "Lease", "Sandbox", "ServerSecret", "Snapshot", "Team",
           "TeamQuota", "TemplateBlob", "TemplateName", "TemplateVersion", "UsageSegment",
           "Volume", "VolumeAttachment", "VolumeBackup"]


class Team(Base):
    __tablename__ = "teams"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    created_at: Mapped[float] = mapped_column(Float)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    team: Mapped[str] = mapped_column(String(128), ForeignKey("teams.id"), index=True)
    name: Mapped[str] = mapped_column(String(128))
    prefix: Mapped[str] = mapped_column(String(16))
    hash: Mapped[str] = mapped_column(String(64), unique=True)
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class Sandbox(Base):
    __tablename__ = "sandboxes"
    __table_args__ = (Index("ix_sandboxes_team_state", "team", "state"),
                      Index("ix_sandboxes_state", "state"),
                      # A name is the team's among sandboxes that have not ended.
                      Index("uq_sandboxes_team_name_live", "team", "name", unique=True,
                            sqlite_where=text("name IS NOT NULL AND ended_at IS NULL"),
                            postgresql_where=text("name IS NOT NULL AND ended_at IS NULL")))

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    team: Mapped[str] = mapped_column(String(128), ForeignKey("teams.id"))
    template: Mapped[str] = mapped_column(String(128))
    state: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ttl_seconds: Mapped[int] = mapped_column(Integer)
    persistent: Mapped[bool] = mapped_column(Boolean, default=False)
    vcpus: Mapped[int] = mapped_column(Integer)
    memory_mb: Mapped[int] = mapped_column(Integer)
    disk_mb: Mapped[int | None] = mapped_column(Integer, nullable=True)
    env: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    last_activity_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    end_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    snapshot: Mapped[str | None] = mapped_column(String(32), nullable=True, default=None)
    # Defaults for commands, from the template the sandbox came from (WORKDIR, USER).
    cwd: Mapped[str | None] = mapped_column(Text, nullable=True, default=None)
    user: Mapped[str | None] = mapped_column(String(64), nullable=True, default=None)
    # The host placed on (hosts.id; no foreign key, see Lease). Not used by the API yet.
    host_id: Mapped[str | None] = mapped_column(String(32), nullable=True, default=None,
                                                index=True)
    # The team's name for it (`Sandbox.get_or_create("user-42")`, server/sandboxes/names.py).
    name: Mapped[str | None] = mapped_column(String(128), nullable=True, default=None)
    # Why its VM ended, while it is `stopped`; how it came back since (ADR 0037).
    stop_reason: Mapped[str | None] = mapped_column(Text, nullable=True, default=None)
    restored_from: Mapped[str | None] = mapped_column(String(16), nullable=True, default=None)
    # A quota reservation while a host call is under way (store/usage.py HOLDS): "awake" (a
    # wake, restart or restore admitted it as a live sandbox), "hibernated" (a hibernate
    # admitted it as a hibernated one). Set with the check, cleared when the call ends.
    quota_hold: Mapped[str | None] = mapped_column(String(16), nullable=True, default=None)
    # What its TTL ends in: None, the sandbox ends (expired); "hibernate", it is hibernated
    # and kept (E2B's autoPause: lifecycle.decide).
    on_expiry: Mapped[str | None] = mapped_column(String(16), nullable=True, default=None)


class Snapshot(Base):
    """A team's snapshot; `deleted_at` is set when it is deleted (the row is kept)."""

    __tablename__ = "snapshots"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    team: Mapped[str] = mapped_column(String(128), ForeignKey("teams.id"), index=True)
    name: Mapped[str | None] = mapped_column(String(128), nullable=True)
    source_sandbox: Mapped[str | None] = mapped_column(String(32), nullable=True)
    template: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[float] = mapped_column(Float)
    vcpus: Mapped[int] = mapped_column(Integer)
    memory_mb: Mapped[int] = mapped_column(Integer)
    disk_mb: Mapped[int | None] = mapped_column(Integer, nullable=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    deleted_at: Mapped[float | None] = mapped_column(Float, nullable=True, default=None)
    # The volume attachments of the source when it was taken (id, name, mount_path,
    # read_only, and the volume's size_mb and host_id): a create from it restores them.
    volumes: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)


class Volume(Base):
    """A team's volume, on one host (`host_id`; None until a host made it). `source_volume`
    is the volume a fork or snapshot restore copied it from. `deleted_at` is set when it is
    deleted (the row is kept; its name is free again)."""

    __tablename__ = "volumes"
    __table_args__ = (Index("uq_volumes_team_name_live", "team", "name", unique=True,
                            sqlite_where=text("deleted_at IS NULL"),
                            postgresql_where=text("deleted_at IS NULL")),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    team: Mapped[str] = mapped_column(String(128), ForeignKey("teams.id"))
    name: Mapped[str] = mapped_column(String(128))
    size_mb: Mapped[int] = mapped_column(Integer)
    host_id: Mapped[str | None] = mapped_column(String(32), nullable=True, default=None)
    source_volume: Mapped[str | None] = mapped_column(String(32), nullable=True, default=None)
    created_at: Mapped[float] = mapped_column(Float)
    deleted_at: Mapped[float | None] = mapped_column(Float, nullable=True, default=None)
    # A move under way (server/volume_moves.py): the host it goes to until the row names
    # that host, then the host it left until its copy there is deleted.
    moving_to: Mapped[str | None] = mapped_column(String(32), nullable=True, default=None)
    moving_from: Mapped[str | None] = mapped_column(String(32), nullable=True, default=None)
    # MiB a resize under way has admitted on top of `size_mb` (counted against the team's
    # max_volume_gb until the resize lands or fails).
    reserved_mb: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class VolumeBackup(Base):
    """A backup of a team's volume in the object store (`volumes.snapshot`): it outlives the
    volume. `volume_name` is the name the volume had when it was taken."""

    __tablename__ = "volume_backups"
    __table_args__ = (Index("ix_volume_backups_team", "team"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    team: Mapped[str] = mapped_column(String(128), ForeignKey("teams.id"))
    volume_id: Mapped[str] = mapped_column(String(32))
    volume_name: Mapped[str] = mapped_column(String(128))
    size_mb: Mapped[int] = mapped_column(Integer)
    stored_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[float] = mapped_column(Float)
    deleted_at: Mapped[float | None] = mapped_column(Float, nullable=True, default=None)


class VolumeAttachment(Base):
    """A volume attached to a sandbox that has not ended (a hibernated one keeps it). No
    foreign keys: the rows go in the transaction that ends the sandbox."""

    __tablename__ = "volume_attachments"
    __table_args__ = (Index("ix_volume_attachments_sandbox", "sandbox_id"),)

    volume_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    sandbox_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    mount_path: Mapped[str] = mapped_column(Text)
    read_only: Mapped[bool] = mapped_column(Boolean)


class TemplateVersion(Base):
    """One build of a team's template: `name` + `version` (1, 2, ...). `status` is
    building, ready or failed; a ready version points at the snapshot creates restore.
    `deleted_at` is set when it is deleted; deleted and failed rows are pruned after the
    retention (`template_names` keeps their numbers taken). The build's spec and logs are in
    `template_blobs`: these rows are read on every create from a team template."""

    __tablename__ = "template_versions"
    __table_args__ = (Index("ix_template_versions_team_name", "team", "name"),
                      # what the reaper's pruning looks for
                      Index("ix_template_versions_status", "status"),
                      Index("ix_template_versions_deleted_at", "deleted_at"),
                      UniqueConstraint("team", "name", "version",
                                       name="uq_template_versions_version"))

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # the build id
    team: Mapped[str] = mapped_column(String(128), ForeignKey("teams.id"))
    name: Mapped[str] = mapped_column(String(128))
    version: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    snapshot_id: Mapped[str | None] = mapped_column(String(64), nullable=True, default=None)
    env: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    cwd: Mapped[str | None] = mapped_column(Text, nullable=True, default=None)
    user: Mapped[str | None] = mapped_column(String(64), nullable=True, default=None)
    vcpus: Mapped[int | None] = mapped_column(Integer, nullable=True, default=None)
    memory_mb: Mapped[int | None] = mapped_column(Integer, nullable=True, default=None)
    error: Mapped[str | None] = mapped_column(Text, nullable=True, default=None)
    steps_total: Mapped[int | None] = mapped_column(Integer, nullable=True, default=None)
    steps_cached: Mapped[int | None] = mapped_column(Integer, nullable=True, default=None)
    # The ExposedPorts of the image the version was built FROM ("8080/tcp"); None: none.
    exposed_ports: Mapped[list[str] | None] = mapped_column(JSON, nullable=True, default=None)
    # What the version stores (max_template_gb): while it builds, the bytes its admission
    # reserved; once ready, its disk image and snapshot as the host measured them. A failed
    # or deleted version counts nothing (store/usage.py template_use_gib).
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    created_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True, default=None)
    deleted_at: Mapped[float | None] = mapped_column(Float, nullable=True, default=None)


class TemplateBlob(Base):
    """The large parts of one build, read only when asked for: the spec as built (COPY files
    as size and digest, not their bodies) and the log lines."""

    __tablename__ = "template_blobs"

    # No foreign key: a later batch migration of template_versions recreates that table on
    # SQLite, and the DROP would cascade to (or fail on) these rows. The repo removes a
    # build's blob with its row.
    build_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    logs: Mapped[str | None] = mapped_column(Text, nullable=True, default=None)


class TemplateName(Base):
    """The newest version number a team's template name ever had, so that numbers stay
    monotonic after versions are pruned (a sandbox's `app:3` names one build, forever)."""

    __tablename__ = "template_names"

    team: Mapped[str] = mapped_column(String(128), ForeignKey("teams.id"), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    last_version: Mapped[int] = mapped_column(Integer)


class ServerSecret(Base):
    """Secrets of the server itself (e.g. the key that signs port URLs), generated once."""

    __tablename__ = "server_secrets"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)


class UsageSegment(Base):
    """One interval over which a team held one resource (store/usage.py): `kind` compute
    (`vcpus`, `memory_mb`), disk, volume or snapshot (`gib`); `ended_at` None while it is
    held. Written in the transaction of the state change that opens or closes it; no foreign
    key, so that purging ended sandboxes keeps what they used."""

    __tablename__ = "usage_segments"
    __table_args__ = (Index("ix_usage_segments_team_started", "team", "started_at"),
                      Index("ix_usage_segments_subject", "subject_id"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    team: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(16))
    subject_id: Mapped[str] = mapped_column(String(64))
    # The sandbox it is billed under: the sandbox's own id, a snapshot's source; None for a
    # volume.
    sandbox_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    template: Mapped[str | None] = mapped_column(String(128), nullable=True)
    vcpus: Mapped[int] = mapped_column(Integer, default=0)
    memory_mb: Mapped[int] = mapped_column(Integer, default=0)
    gib: Mapped[float] = mapped_column(Float, default=0.0)
    started_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True, default=None)


class TeamQuota(Base):
    """An admin's limits for one team; a None column is the server's default for it."""

    __tablename__ = "team_quotas"

    team: Mapped[str] = mapped_column(String(128), ForeignKey("teams.id"), primary_key=True)
    max_sandboxes: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_vcpus: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_memory_mb: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_volume_gb: Mapped[float | None] = mapped_column(Float, nullable=True)
    monthly_budget_usd: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_hibernated: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_snapshot_gb: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_template_gb: Mapped[float | None] = mapped_column(Float, nullable=True)
    updated_at: Mapped[float] = mapped_column(Float)
