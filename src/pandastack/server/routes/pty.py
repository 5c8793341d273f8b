"""Terminals: start a process on a pseudo-terminal, and its WebSocket (wire_pty.PTY_WEBSOCKET
says what goes over it). The WebSocket is checked as every sandbox route is (the caller's key,
its team's sandbox, a hibernated one woken) before the handshake is accepted; a refusal is
the error envelope as the handshake's HTTP answer. While it is open the idle reaper leaves
the sandbox alone."""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from pandastack.hostport import pty
from pandastack.hostport.errors import GuestOSError, HostError
from pandastack.wire.pty import PTY_WEBSOCKET, PtyCreateRequest, PtyInfo

from ..accounts.auth import CurrentPrincipal, principal
from ..sandboxes.service import SandboxService
from ..web.errors import ApiError, bad_request, not_found
from ..web.jsonbody import StrictJsonRoute
from .deps import SandboxId, Service, check_text
from .ports import as_request, deny

router = APIRouter(tags=["pty"], route_class=StrictJsonRoute)


@router.post("/sandboxes/{sandbox_id}/pty", status_code=201, operation_id="createPty",
             response_model=PtyInfo, summary="Start a process on a new terminal",
             description=PTY_WEBSOCKET)
async def create_pty(sandbox_id: SandboxId, body: PtyCreateRequest, who: CurrentPrincipal,
                     service: Service) -> PtyInfo:
    check_text(body.cmd, "cmd")
    check_text(body.env, "env")
    check_text(body.cwd, "cwd")
    check_text(body.user, "user")
    row, handle = await service.running(who.team, sandbox_id)
    env, cwd, user = service.call_context(row, body.env, body.cwd)
    pid = await service.host_call(handle.pty_create(
        cols=body.cols, rows=body.rows, cmd=body.cmd, env=env, cwd=cwd,
        user=body.user or user))
    return PtyInfo(pid=pid, cols=body.cols, rows=body.rows)


async def _attach(websocket: WebSocket, service: SandboxService, sandbox_id: str,
                  pid: int) -> tuple[str, str, pty.PtySession]:
    team = (await principal(as_request(websocket))).team
    row, handle = await service.running(team, sandbox_id)
    try:
        return team, row.id, await handle.pty_connect(pid)
    except GuestOSError as exc:
        if exc.errno_name == "ESRCH":
            raise not_found(f"terminal {pid} in sandbox {row.id}") from None
        if exc.errno_name == "EINVAL":
            raise bad_request(f"process {pid} has no terminal") from None
        raise


async def connect_pty(websocket: WebSocket, sandbox_id: str, pid: str) -> None:
    service: SandboxService = websocket.app.state.service
    try:
        if not (pid.isascii() and pid.isdigit() and 1 <= int(pid) < 2**31):
            raise ApiError(422, "validation_error", "pid: must be an integer in 1..2**31-1")
        team, sandbox_id, session = await service.host_call(
            _attach(websocket, service, sandbox_id, int(pid)))
    except ApiError as exc:
        await deny(websocket, exc)
        return
    except HostError as exc:  # not one host_call maps: still an answer, not a dropped socket
        await deny(websocket, ApiError(502, "bad_gateway", str(exc)))
        return
    try:
        release = service.stream_slots.acquire(team)
    except ApiError as exc:
        await session.close()
        await deny(websocket, exc)
        return
    try:
        try:
            await websocket.accept()
        except BaseException:
            await session.close()
            raise
        async with service.busy(sandbox_id):
            await pty.relay(websocket, session)
    finally:
        release()


router.add_api_websocket_route("/sandboxes/{sandbox_id}/pty/{pid}", connect_pty,
                               name="connect_pty")
