"""Registry credentials as a template build carries them to the host: the team's, for the
registries its images are pulled from, opened by the control plane for this one build. The
host holds them in memory for the build (the pull's `Authorization`), never on disk, in a
log line, a guest or an error."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RegistryLogin:
    username: str
    password: str = field(repr=False)


#: registry host[:port] as image references name it (`docker.io` for Docker Hub) -> login
RegistryLogins = Mapping[str, RegistryLogin]
