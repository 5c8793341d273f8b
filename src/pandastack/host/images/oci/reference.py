"""Image references as Docker and the distribution project write them.

`python:3.12-slim` is `docker.io/library/python:3.12-slim`; the first path component is a
registry host only when it has a `.` or a `:` or is `localhost`; `@sha256:...` pins a digest
(a tag beside it is kept for messages, the digest wins); neither gives `latest`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pandastack.host.images.oci.errors import InvalidImageReference

DOCKER_HUB = "docker.io"
# Docker Hub's distribution API is not served on the name people write.
DOCKER_HUB_API = "registry-1.docker.io"
_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})
DEFAULT_TAG = "latest"
MAX_REFERENCE_LENGTH = 512

_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST = re.compile(r"sha256:[a-f0-9]{64}")
_HOST_PORT = re.compile(
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
    r"|\[[0-9a-fA-F:]+\])(?::(?P<port>[0-9]{1,5}))?")


@dataclass(frozen=True)
class ImageReference:
    registry: str  # host or host:port as written (docker.io for Docker Hub)
    repository: str  # path inside the registry (library/python)
    tag: str | None = None
    digest: str | None = None

    @property
    def reference(self) -> str:
        """What the manifest is asked for: the digest when pinned, else the tag."""
        return self.digest or self.tag or DEFAULT_TAG

    @property
    def api_host(self) -> str:
        return DOCKER_HUB_API if self.registry == DOCKER_HUB else self.registry

    def __str__(self) -> str:
        text = f"{self.registry}/{self.repository}"
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def _split_host(text: str) -> tuple[str, str] | None:
    """(registry, rest) when the first component names a registry host, else None."""
    first, sep, rest = text.partition("/")
    if not sep or not ("." in first or ":" in first or first == "localhost"):
        return None
    match = _HOST_PORT.fullmatch(first)
    if not match or (match["port"] is not None and not 0 < int(match["port"]) < 65536):
        raise InvalidImageReference(text, f"{first!r} is not a registry host[:port]")
    return first.lower(), rest


def parse_reference(text: str) -> ImageReference:
    """Parse `[host[:port]/]path[:tag][@sha256:hex]`; raise InvalidImageReference."""
    text = text.strip()
    if not text or len(text) > MAX_REFERENCE_LENGTH:
        raise InvalidImageReference(text[:80] or "''", "empty or longer than "
                                    f"{MAX_REFERENCE_LENGTH} characters")
    name, at, digest = text.partition("@")
    if at and not _DIGEST.fullmatch(digest):
        raise InvalidImageReference(text, "a digest is sha256: and 64 lowercase hex digits")
    tag: str | None = None
    last_slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > last_slash:
        name, tag = name[:colon], name[colon + 1:]
        if not _TAG.fullmatch(tag):
            raise InvalidImageReference(text, f"{tag!r} is not a valid tag")
    split = _split_host(name)
    registry, path = split if split else (DOCKER_HUB, name)
    if registry in _HUB_ALIASES:
        registry = DOCKER_HUB
    components = path.split("/")
    if not path or not all(_COMPONENT.fullmatch(c) for c in components):
        raise InvalidImageReference(
            text, "repository names are lowercase letters, digits and separators (. _ __ -)")
    if registry == DOCKER_HUB and len(components) == 1:
        path = f"library/{path}"
    return ImageReference(registry=registry, repository=path, tag=tag,
                          digest=digest if at else None)

