"""Registry authentication: the `WWW-Authenticate` challenge, the bearer-token flow Docker Hub
and ghcr use (anonymous or with credentials), and basic auth."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field

_PARAM = re.compile(r'\s*([a-zA-Z_]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))\s*,?')


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)  # never in a log line or an error

    def basic_header(self) -> str:
        pair = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(pair).decode()


@dataclass(frozen=True)
class Challenge:
    scheme: str  # "bearer" or "basic", lowercased
    params: dict[str, str]


def parse_challenge(header: str) -> Challenge | None:
    """The first challenge of a WWW-Authenticate header (registries send one)."""
    scheme, _, rest = header.strip().partition(" ")
    if not scheme:
        return None
    params: dict[str, str] = {}
    position = 0
    while position < len(rest):
        match = _PARAM.match(rest, position)
        if not match or match.end() == position:
            break
        quoted, bare = match.group(2), match.group(3)
        value = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare or ""
        params[match.group(1).lower()] = value
        position = match.end()
    return Challenge(scheme=scheme.lower(), params=params)


def pull_scope(repository: str) -> str:
    return f"repository:{repository}:pull"
