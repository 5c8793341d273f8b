"""Call builders of sandboxes by name (server/sandboxes/names.py): a name is the team's for a
sandbox that has not ended; `get_or_create` answers the live one or makes one. (A lookup takes an
id or a name as it is: `GET /v1/sandboxes/{id or name}`.)"""

from __future__ import annotations

from dataclasses import replace

from pandastack.sdk._base import Call, path_segment
from pandastack.sdk.models import SandboxInfo


def by_name_path(name: str) -> str:
    return "/v1/sandboxes/by-name/" + path_segment(name)


def get_or_create_call(create: Call[SandboxInfo], name: str) -> Call[SandboxInfo]:
    """The create `create` (built with `name`) as a get-or-create of that name."""
    return replace(create, method="PUT", path=by_name_path(name))

