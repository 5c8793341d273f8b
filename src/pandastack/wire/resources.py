"""Wire types of the REST API's account-level resources (keys, templates, hosts, volumes),
shared by the server and the SDK. Field names are the JSON field names; unknown fields are
rejected, sizes and ranges are bounded."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pandastack.rules import (
    DEFAULT_MEMORY_MB,
    DEFAULT_VCPUS,
    DEFAULT_VOLUME_MB,
    MAX_MEMORY_MB,
    MAX_VCPUS,
    MAX_VOLUME_MB,
    MIN_MEMORY_MB,
    MIN_VCPUS,
    MIN_VOLUME_MB,
    TEMPLATE_NAME_PATTERN,
    VOLUME_NAME_PATTERN,
)
from pandastack.templatespec.models import TemplateSpec
from pandastack.wire.base import Strict
from pandastack.wire.sandboxes import NetworkSpec

# What a client gets back from this part of the API: `pandastack.sdk.models` re-exports
# these (`import *`), so a new result model is named here, beside its class.
__all__ = [
    "CreatedKey",
    "DrainResult",
    "HostInfo",
    "HostState",
    "KeyInfo",
    "VolumeAttachment",
    "VolumeInfo",
    "VolumeSnapshotInfo",
]

# -- keys ---------------------------------------------------------------------------------

class CreateKey(Strict):
    name: str = Field(min_length=1, max_length=128)
    team: str | None = Field(default=None, max_length=128)


class KeyInfo(Strict):
    id: str
    name: str
    team: str
    prefix: str
    created_at: float
    revoked: bool = False


class CreatedKey(KeyInfo):
    key: str  # shown once


class KeyList(Strict):
    keys: list[KeyInfo]


# -- templates ----------------------------------------------------------------------------

TemplateBuildStatus = Literal["building", "ready", "failed"]


class BuildTemplate(Strict):
    """Build a new version of the team template `name` from `spec`. The build runs inside a
    microVM whose egress follows `network` (default: the default sandbox policy)."""

    name: str = Field(pattern=TEMPLATE_NAME_PATTERN)
    spec: TemplateSpec
    vcpus: int = Field(default=DEFAULT_VCPUS, ge=MIN_VCPUS, le=MAX_VCPUS)
    memory_mb: int = Field(default=DEFAULT_MEMORY_MB, ge=MIN_MEMORY_MB, le=MAX_MEMORY_MB)
    network: NetworkSpec | None = None


class TemplateBuildInfo(Strict):
    build_id: str
    name: str
    version: int
    status: TemplateBuildStatus
    created_at: float
    finished_at: float | None = None
    error: str | None = None
    steps_total: int | None = None
    steps_cached: int | None = None
    exposed_ports: list[str] = Field(
        default_factory=list, description="the ports the image the template was built FROM "
                                          "declares (its config's ExposedPorts, e.g. "
                                          "\"8080/tcp\"; none FROM a template) and the "
                                          "spec's own (a Dockerfile's EXPOSE), each once, "
                                          "sorted")


class TemplateInfo(Strict):
    name: str
    versions: list[TemplateBuildInfo]


class BuiltinTemplateInfo(Strict):
    """A template every host has (built on a host's first use of it); no team builds it."""

    name: str
    default: bool = Field(default=False, description="what a create that names no template "
                                                      "starts from")


class TemplateList(Strict):
    templates: list[TemplateBuildInfo]
    builtin: list[BuiltinTemplateInfo] = Field(
        default_factory=list, description="the built-in templates, beside the team's own "
                                          "(`templates`): every team may use them")


# -- hosts (admin keys; where the server drives a cluster of agents) ---------------------

#: `draining`: live, but takes no new sandbox; `stale`: its heartbeat is older than the stale
#: window (it takes no sandbox, requests for its sandboxes are 503 `host_unavailable`);
#: `lost`: stale past the loss grace, fenced (its running sandboxes are `host_lost`).
HostState = Literal["live", "draining", "incompatible", "stale", "lost"]


class HostInfo(Strict):
    id: str
    endpoint: str
    state: HostState
    vcpus: int
    memory_mb: int
    disk_mb: int
    used_vcpus: int = 0
    used_memory_mb: int = 0
    sandboxes: int = 0  # as the agent last reported, hibernated ones included
    templates: list[str] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    version: str = ""
    epoch: int
    heartbeat_age_seconds: float  # by the database's clock
    protocol: int = 1  # the host API protocol level its agent speaks
    # Why this API server places no sandbox there (state `incompatible`: a version apart).
    incompatible_reason: str = ""


class HostList(Strict):
    hosts: list[HostInfo]


class DrainResult(Strict):
    """What a drain did: each sandbox it moved (to the host it went to), each it could not
    move (why; it stays running where it was, and draining again retries it), and the
    hibernated ones, which stay (their state is in the object store already)."""

    host_id: str
    moved: dict[str, str] = Field(default_factory=dict)
    failed: dict[str, str] = Field(default_factory=dict)
    stayed_hibernated: list[str] = Field(default_factory=list)
    moved_live: list[str] = Field(
        default_factory=list, description="of the moved, those that moved live (paused only "
                                          "for the switch); the others moved cold")


# -- volumes ------------------------------------------------------------------------------


class CreateVolume(Strict):
    name: str = Field(pattern=VOLUME_NAME_PATTERN)
    size_mb: int | None = Field(
        default=None, ge=MIN_VOLUME_MB, le=MAX_VOLUME_MB,
        description=f"default {DEFAULT_VOLUME_MB}; from a snapshot, the snapshot's size (a "
                    "larger size grows the restored file system)")
    # Admin only, where the server drives many hosts: the host the volume lives on.
    host_id: str | None = Field(default=None, max_length=64)
    from_snapshot: str | None = Field(
        default=None, max_length=64,
        description="a volume snapshot of the team (`POST /v1/volumes/{name}/snapshots`): the "
                    "new volume holds what it holds, on any host that shares the object "
                    "store")


class ResizeVolume(Strict):
    size_mb: int = Field(ge=MIN_VOLUME_MB, le=MAX_VOLUME_MB)


class VolumeAttachment(Strict):
    sandbox_id: str
    mount_path: str
    read_only: bool


class VolumeInfo(Strict):
    id: str
    name: str
    size_mb: int
    created_at: float
    host_id: str | None = None  # the host it lives on, where the server drives many
    source_volume: str | None = None  # the volume it was copied from (a fork's child's)
    attachments: list[VolumeAttachment] = Field(default_factory=list)


class VolumeList(Strict):
    volumes: list[VolumeInfo]


class MoveVolume(Strict):
    host_id: str = Field(max_length=64)
    team: str | None = Field(default=None, max_length=128,
                             description="the volume's team (default: the admin key's)")


class VolumeSnapshotInfo(Strict):
    """A volume's contents at one instant, in the object store: it outlives the volume."""

    id: str
    volume_name: str  # the volume's name when it was taken
    volume_id: str
    size_mb: int
    stored_bytes: int = Field(description="what its data takes in the object store (holes "
                                          "and chunks stored before are not counted)")
    created_at: float


class VolumeSnapshotList(Strict):
    snapshots: list[VolumeSnapshotInfo]
