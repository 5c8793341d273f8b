"""What the sandbox listener resolved for a request before a room's handler runs: the sandbox
(already checked to be running or woken, and the caller's by token or key), its team, the
port named, and the OS user the SDK asked for (`Authorization: Basic base64("user:")`)."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import HTTPConnection

from pandastack.server.sandboxes.service import SandboxService

SCOPE_KEY = "pandastack.e2b.target"
ENVD_PORT = 49983
INTERPRETER_PORT = 49999
# E2B's images run commands as `user` when the SDK names none (host/images/rootfs.py).
DEFAULT_USER = "user"


@dataclass(frozen=True)
class SandboxTarget:
    service: SandboxService
    team: str
    sandbox_id: str
    port: int
    user: str | None  # from Basic auth; None: the SDK named none


def target_of(conn: HTTPConnection) -> SandboxTarget:
    target = conn.scope.get(SCOPE_KEY)
    if not isinstance(target, SandboxTarget):
        raise RuntimeError("an E2B sandbox handler ran outside the sandbox listener")
    return target

# The envd protocol level this room answers, reported as every sandbox's `envdVersion`: the
# SDKs gate features on it (e2b/envd/versions.py: 0.3.0 stdin, 0.4.0 default user, 0.5.2
# close stdin, 0.5.7 octet-stream upload, 0.6.2 file metadata, 0.6.3 watch events with
# entries, 0.6.4 watching network mounts; tests/e2e/test_e2b_files.py). Raise it only with
# what it gates implemented and tested.
ENVD_VERSION = "0.6.4"
