"""Operator settings for pulling images, read from the environment (ADR 0046)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

MIB = 1 << 20
DEFAULT_MAX_IMAGE_MB = 10 * 1024  # compressed, as the registry serves it
DEFAULT_MAX_UNPACKED_MB = 20 * 1024
DEFAULT_MAX_LAYERS = 128  # overlay-era Docker allowed 127
DEFAULT_MAX_ENTRIES = 1_000_000  # tar entries in one image, all layers together
DEFAULT_LAYER_CACHE_MB = 20 * 1024
MAX_MANIFEST_BYTES = 4 * MIB  # as containerd
MAX_CONFIG_BYTES = 8 * MIB
MAX_TOKEN_BYTES = 1 * MIB


@dataclass(frozen=True)
class RegistrySettings:
    # host:port of registries spoken to over plain HTTP (PANDASTACK_INSECURE_REGISTRIES); every
    # other one over HTTPS, verified against the system's CAs or `ca_bundle`.
    insecure: frozenset[str] = frozenset()
    # registry -> host[:port] that serves it instead (PANDASTACK_REGISTRY_MIRRORS, e.g.
    # docker.io=127.0.0.1:5000): the mirror is asked, never the registry itself.
    mirrors: Mapping[str, str] = field(default_factory=dict)
    ca_bundle: Path | None = None  # PANDASTACK_REGISTRY_CA_BUNDLE
    max_image_bytes: int = DEFAULT_MAX_IMAGE_MB * MIB  # PANDASTACK_IMAGE_MAX_MB
    max_unpacked_bytes: int = DEFAULT_MAX_UNPACKED_MB * MIB  # PANDASTACK_IMAGE_MAX_UNPACKED_MB
    max_layers: int = DEFAULT_MAX_LAYERS  # PANDASTACK_IMAGE_MAX_LAYERS
    max_entries: int = DEFAULT_MAX_ENTRIES
    layer_cache_bytes: int = DEFAULT_LAYER_CACHE_MB * MIB  # PANDASTACK_LAYER_CACHE_MB
    # A registry that does not connect or answer within this many seconds is unavailable;
    # resolving a reference to its manifest and config must end within `deadline_s`.
    timeout_s: float = 30.0
    deadline_s: float = 120.0

    def __post_init__(self) -> None:
        for name in ("max_image_bytes", "max_unpacked_bytes", "max_layers", "max_entries",
                     "layer_cache_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)}")
        if self.timeout_s <= 0 or self.deadline_s <= 0:
            raise ValueError("registry timeouts must be positive")

    def endpoint(self, registry_host: str) -> str:
        """The base URL the distribution API of `registry_host` (an api host) is asked at."""
        host = self.mirrors.get(registry_host, registry_host)
        return f"{'http' if host in self.insecure else 'https'}://{host}"

    def allows(self, scheme: str, host_port: str) -> bool:
        """Whether a URL a registry sent (token realm, redirect) may be followed."""
        return scheme == "https" or (scheme == "http" and host_port in self.insecure)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RegistrySettings:
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        insecure = _list(env.get("PANDASTACK_INSECURE_REGISTRIES", ""))
        values["insecure"] = frozenset(insecure)
        mirrors: dict[str, str] = {}
        for item in _list(env.get("PANDASTACK_REGISTRY_MIRRORS", "")):
            registry, eq, mirror = item.partition("=")
            if not eq or not registry.strip() or not mirror.strip():
                raise ValueError(f"PANDASTACK_REGISTRY_MIRRORS: {item!r} is not registry=host")
            mirrors[_api_name(registry.strip())] = mirror.strip()
        values["mirrors"] = mirrors
        if env.get("PANDASTACK_REGISTRY_CA_BUNDLE", "").strip():
            values["ca_bundle"] = Path(env["PANDASTACK_REGISTRY_CA_BUNDLE"].strip())
        for var, name, unit in (("PANDASTACK_IMAGE_MAX_MB", "max_image_bytes", MIB),
                                ("PANDASTACK_IMAGE_MAX_UNPACKED_MB", "max_unpacked_bytes", MIB),
                                ("PANDASTACK_IMAGE_MAX_LAYERS", "max_layers", 1),
                                ("PANDASTACK_LAYER_CACHE_MB", "layer_cache_bytes", MIB)):
            if env.get(var, "").strip():
                values[name] = int(env[var]) * unit
        return cls(**values)  # type: ignore[arg-type]


def _list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _api_name(registry: str) -> str:
    from pandastack.host.images.oci.reference import DOCKER_HUB, DOCKER_HUB_API

    return DOCKER_HUB_API if registry in (DOCKER_HUB, "index.docker.io") else registry
