"""What the host API's routes take from the app: the host they serve, and the sandbox a path
names (looked up first, so that a missing one is a 404 before any stream starts)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from pandastack.hostport.protocols import RuntimePort, SandboxPort


def get_host(request: Request) -> RuntimePort:
    host: RuntimePort = request.app.state.host
    return host


Host = Annotated[RuntimePort, Depends(get_host)]


async def get_sandbox(sandbox_id: str, host: Host) -> SandboxPort:
    return await host.get(sandbox_id)


Sandbox = Annotated[SandboxPort, Depends(get_sandbox)]
