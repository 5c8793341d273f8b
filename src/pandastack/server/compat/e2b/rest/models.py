"""E2B's request bodies (spec/openapi.yml of e2b-dev/E2B), by their JSON names. Unknown
fields are refused (400 naming them): a field we do not know may ask for something we would
otherwise silently not do. Sizes are bounded as in our own API."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from pandastack.rules import (
    MAX_ENV_ITEMS,
    MAX_FORK,
    MAX_METADATA_ITEMS,
    MAX_NETWORK_RULES,
    MAX_TTL_SECONDS,
    MAX_VOLUMES_PER_SANDBOX,
)


class E2bBody(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=False, strict=True)


class AutoResume(E2bBody):
    enabled: bool


class EgressRules(E2bBody):
    """The egress part both a create's `network` and a network update carry."""

    allow_out: list[str] | None = Field(default=None, alias="allowOut",
                                        max_length=MAX_NETWORK_RULES)
    deny_out: list[str] | None = Field(default=None, alias="denyOut",
                                       max_length=MAX_NETWORK_RULES)
    dns_servers: list[str] | None = Field(default=None, alias="dnsServers", max_length=10)
    egress_proxy: dict[str, Any] | None = Field(default=None, alias="egressProxy")
    rules: dict[str, Any] | None = None


class NetworkConfig(EgressRules):
    """`network` of a create: egress rules, and the public-traffic switch of its ports."""

    allow_public_traffic: bool | None = Field(default=None, alias="allowPublicTraffic")
    mask_request_host: str | None = Field(default=None, alias="maskRequestHost")
    https_ports: list[int] | None = Field(default=None, alias="httpsPorts", max_length=64)


class NetworkUpdate(EgressRules):
    """`PUT /sandboxes/{id}/network`."""

    allow_internet_access: bool | None = None


class VolumeMount(E2bBody):
    name: str = Field(min_length=1, max_length=128)
    path: str = Field(min_length=1, max_length=1024)


class NewSandbox(E2bBody):
    """`POST /sandboxes` (SDK < 2.51, with `secure`) and `POST /v2/sandboxes`."""

    template_id: str = Field(alias="templateID", min_length=1, max_length=128)
    timeout: int | None = Field(default=None, ge=0, le=MAX_TTL_SECONDS)
    auto_pause: bool | None = Field(default=None, alias="autoPause")
    auto_pause_memory: bool | None = Field(default=None, alias="autoPauseMemory")
    auto_resume: AutoResume | None = Field(default=None, alias="autoResume")
    secure: bool | None = None
    allow_internet_access: bool | None = None
    network: NetworkConfig | None = None
    metadata: dict[str, str] | None = Field(default=None, max_length=MAX_METADATA_ITEMS)
    env_vars: dict[str, str] | None = Field(default=None, alias="envVars",
                                            max_length=MAX_ENV_ITEMS)
    mcp: dict[str, Any] | None = None
    iam: dict[str, Any] | None = None
    volume_mounts: list[VolumeMount] | None = Field(default=None, alias="volumeMounts",
                                                    max_length=MAX_VOLUMES_PER_SANDBOX)


class Connect(E2bBody):
    """`POST .../connect` (v1: timeout required; v2: 300 when left out)."""

    timeout: int | None = Field(default=None, ge=0, le=MAX_TTL_SECONDS)
    memory: bool | None = None  # False: E2B's cold boot; ours always keeps memory


class Resume(E2bBody):
    timeout: int | None = Field(default=None, ge=0, le=MAX_TTL_SECONDS)
    auto_pause: bool | None = Field(default=None, alias="autoPause")


class Timeout(E2bBody):
    timeout: int = Field(ge=0, le=MAX_TTL_SECONDS)


class Refresh(E2bBody):
    duration: int | None = Field(default=None, ge=0, le=3600)


class Pause(E2bBody):
    memory: bool | None = None  # False: filesystem only; ours keeps memory anyway
    require_healthy_guest: bool | None = Field(default=None, alias="requireHealthyGuest")


class Fork(E2bBody):
    timeout: int | None = Field(default=None, ge=0, le=MAX_TTL_SECONDS)
    count: int | None = Field(default=None, ge=1, le=MAX_FORK)


class SnapshotRequest(E2bBody):
    name: str | None = Field(default=None, max_length=128)
    memory: bool | None = None
