"""Which registry an image reference is pulled from, as Docker reads it, and a registry host as
a team writes it for its credentials (`pandastack registry login ghcr.io`): the control plane
picks a build's credentials by the first, keyed by the second, and the host's reference parser
(`host/images/oci/reference.py`) must agree with both (tests/templatespec/test_registry_host.py
holds them to the same answers)."""

from __future__ import annotations

import re

DOCKER_HUB = "docker.io"
# Docker Hub answers to several names; credentials for any of them are Docker Hub's.
HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})
MAX_REGISTRY_LENGTH = 255

_HOST_PORT = re.compile(
    r"(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*"
    r"|\[[0-9a-f:]+\])(?::(?P<port>[0-9]{1,5}))?")


def normal_registry(text: str) -> str:
    """`host[:port]` lowercased (Docker Hub's names all `docker.io`); ValueError otherwise.
    The message never repeats more than the registry as written."""
    host = text.strip().lower()
    match = _HOST_PORT.fullmatch(host) if len(host) <= MAX_REGISTRY_LENGTH else None
    if match is None or (match["port"] is not None and not 0 < int(match["port"]) < 65536):
        raise ValueError("a registry is host[:port], e.g. ghcr.io, docker.io or "
                         "registry.example.com:5000")
    return DOCKER_HUB if host in HUB_ALIASES else host


def image_registry(reference: str) -> str:
    """The registry `reference` (an image as a build's FROM names it) is pulled from: the
    first path component when it has a `.` or a `:` or is `localhost`, else Docker Hub."""
    name = reference.strip().partition("@")[0]
    first, slash, _ = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        host = first.lower()
        return DOCKER_HUB if host in HUB_ALIASES else host
    return DOCKER_HUB
