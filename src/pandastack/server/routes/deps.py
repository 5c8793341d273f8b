"""Dependencies and small helpers shared by the route modules."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from pandastack.hostport.results import ExecResult as HostExecResult
from pandastack.wire.sandboxes import ExecResult

from ..sandboxes.service import SandboxService
from ..settings import Settings
from ..web.errors import bad_request

SANDBOX_ID = Path(max_length=64, description="sandbox id, e.g. sbx-0123456789ab")


# Dependencies are `async def`: FastAPI runs a plain `def` one in its thread pool, a thread hop
# (ms on a loaded host) on every request for an attribute read.
async def get_service(request: Request) -> SandboxService:
    service: SandboxService = request.app.state.service
    return service


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


Service = Annotated[SandboxService, Depends(get_service)]
AppSettings = Annotated[Settings, Depends(get_settings)]
SandboxId = Annotated[str, SANDBOX_ID]


def check_path(path: str, what: str = "path") -> str:
    if "\x00" in path:
        raise bad_request(f"{what} must not contain NUL bytes")
    return path


def check_text(values: dict[str, str] | list[str] | str | None, what: str) -> None:
    """Guest processes cannot take NUL bytes in argv, env or cwd: reject them here (400)."""
    if values is None:
        return
    items: list[str]
    if isinstance(values, str):
        items = [values]
    elif isinstance(values, dict):
        items = [*values.keys(), *values.values()]
        if any(not k or "=" in k for k in values):
            raise bad_request(f"{what}: names must be non-empty and must not contain '='")
    else:
        items = list(values)
    if any("\x00" in v for v in items):
        raise bad_request(f"{what} must not contain NUL bytes")


def to_exec_result(res: HostExecResult, *, with_output: bool = True) -> ExecResult:
    return ExecResult(
        exit_code=res.exit_code,
        stdout=res.stdout.decode("utf-8", "replace") if with_output else "",
        stderr=res.stderr.decode("utf-8", "replace") if with_output else "",
        duration_ms=res.duration_ms, timed_out=res.timed_out, signal=res.signal,
        truncated=res.truncated,
    )
