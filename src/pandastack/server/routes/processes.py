"""Background processes: start, list, feed stdin, signal, wait."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response

from pandastack.rules import MAX_EXEC_TIMEOUT_SECONDS
from pandastack.wire.sandboxes import (
    ExecResult,
    ProcessInfo,
    ProcessList,
    SignalRequest,
    StartProcess,
)

from ..accounts.auth import CurrentPrincipal
from ..web.errors import ApiError, clean_text
from ..web.jsonbody import StrictJsonRoute
from .deps import AppSettings, SandboxId, Service, check_text, to_exec_result
from .links import links

router = APIRouter(tags=["processes"], route_class=StrictJsonRoute)

Pid = Annotated[int, Path(ge=1, le=2**31 - 1)]


@router.post("/sandboxes/{sandbox_id}/processes", status_code=201, response_model=ProcessInfo,
             responses=links(201, ("signalProcess", "writeProcessStdin", "waitProcess"),
                             {"sandbox_id": "$request.path.sandbox_id",
                              "pid": "$response.body#/pid"}),
             summary="Start a background process (stdin stays open)",
             description="Its output goes to ring buffers in the guest (the last 1 MiB of "
                         "each stream); follow it with GET .../processes/{pid}/stream. With "
                         "`timeout_seconds` its whole cgroup is killed after that long.")
async def start_process(sandbox_id: SandboxId, body: StartProcess, who: CurrentPrincipal,
                        service: Service) -> ProcessInfo:
    check_text(body.cmd, "cmd")
    check_text(body.env, "env")
    check_text(body.cwd, "cwd")
    row, handle = await service.running(who.team, sandbox_id)
    env, cwd, user = service.call_context(row, body.env, body.cwd)
    pid = await service.host_call(handle.spawn(body.cmd, env=env, cwd=cwd, user=user,
                                               timeout=body.timeout_seconds))
    return ProcessInfo(pid=pid, cmd=body.cmd, running=True)


def _process_info(item: dict[str, object]) -> ProcessInfo | None:
    pid, cmd, code = item.get("pid"), item.get("cmd"), item.get("exit_code")
    if not isinstance(pid, int):
        return None
    return ProcessInfo(pid=pid, cmd=clean_text(cmd if isinstance(cmd, str) else str(cmd)),
                       running=bool(item.get("running")),
                       exit_code=code if isinstance(code, int) else None,
                       timed_out=item.get("timed_out") is True)


@router.get("/sandboxes/{sandbox_id}/processes", response_model=ProcessList)
async def list_processes(sandbox_id: SandboxId, who: CurrentPrincipal,
                         service: Service) -> ProcessList:
    _, handle = await service.running(who.team, sandbox_id)
    infos = [_process_info(item) for item in await handle.procs()]
    return ProcessList(processes=[i for i in infos if i is not None])


@router.post("/sandboxes/{sandbox_id}/processes/{pid}/stdin",
             operation_id="writeProcessStdin", status_code=204,
             response_class=Response,
             summary="Write the raw request body to the process's stdin (eof=true closes it)",
             openapi_extra={"requestBody": {"content": {"application/octet-stream": {
                 "schema": {"type": "string", "format": "binary"}}}}})
async def process_stdin(sandbox_id: SandboxId, pid: Pid, request: Request,
                        who: CurrentPrincipal, service: Service, settings: AppSettings,
                        eof: Annotated[bool, Query()] = False) -> Response:
    _, handle = await service.running(who.team, sandbox_id)
    limit = settings.max_upload_bytes
    async with service.busy(sandbox_id):
        buffered = bytearray()
        async for chunk in request.stream():
            buffered += chunk
            if len(buffered) > limit:
                raise ApiError(413, "payload_too_large", f"stdin body over {limit} bytes")
            if len(buffered) >= 1 << 20:
                await handle.send_stdin(pid, bytes(buffered))
                buffered.clear()
        if buffered or eof:
            await handle.send_stdin(pid, bytes(buffered), eof=eof)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/processes/{pid}/signal",
             operation_id="signalProcess", status_code=204,
             response_class=Response)
async def process_signal(sandbox_id: SandboxId, pid: Pid, body: SignalRequest,
                         who: CurrentPrincipal, service: Service) -> Response:
    _, handle = await service.running(who.team, sandbox_id)
    await handle.signal(pid, body.signal)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/processes/{pid}/wait",
             operation_id="waitProcess", response_model=ExecResult,
             summary="Wait for the process to exit; 408 `timeout` if it is still running",
             responses={408: {"description": "still running after timeout_seconds"}})
async def process_wait(sandbox_id: SandboxId, pid: Pid, who: CurrentPrincipal,
                       service: Service,
                       timeout_seconds: Annotated[float | None, Query(
                           gt=0, le=MAX_EXEC_TIMEOUT_SECONDS)] = None) -> ExecResult:
    _, handle = await service.running(who.team, sandbox_id)
    async with service.busy(sandbox_id):
        try:
            result = await asyncio.wait_for(handle.attach(pid), timeout_seconds)
        except TimeoutError:
            raise ApiError(408, "timeout", f"process {pid} still running after "
                                           f"{timeout_seconds:g} s") from None
    return to_exec_result(result)
