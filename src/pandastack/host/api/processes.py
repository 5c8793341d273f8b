"""Routes of the processes in a sandbox: exec (its output streamed), spawn, attach (a spawned
process's output streamed), list, signal, stdin."""

from __future__ import annotations

from fastapi import APIRouter, Response

from pandastack.hostport.frames import Kind
from pandastack.hostport.protocols import SandboxPort
from pandastack.hostport.wire import (
    ExecDone,
    ExecRequest,
    ProcessList,
    SignalRequest,
    Spawned,
    SpawnRequest,
    StdinRequest,
)

from .deps import Sandbox
from .framed import FramedResponse, Outbox, framed_responses

router = APIRouter(prefix="/sandboxes/{sandbox_id}", tags=["processes"])
OUTPUT_FRAMES = "STDOUT and STDERR frames as the process writes"


async def _output(outbox: Outbox, kind: Kind, data: bytes) -> None:
    await outbox.put(kind, data)


@router.post("/exec", operation_id="execCommand", response_class=FramedResponse,
             responses=framed_responses(ExecDone, OUTPUT_FRAMES))
async def exec_command(body: ExecRequest, sandbox: Sandbox) -> FramedResponse:
    async def run(outbox: Outbox) -> ExecDone:
        result = await sandbox.exec(
            body.cmd, timeout=body.timeout, env=body.env, cwd=body.cwd, stdin=body.stdin,
            user=body.user, on_stdout=lambda data: _output(outbox, Kind.STDOUT, data),
            on_stderr=lambda data: _output(outbox, Kind.STDERR, data))
        return ExecDone.of(result)
    return FramedResponse(run)


@router.post("/processes", status_code=201, operation_id="spawnProcess")
async def spawn_process(body: SpawnRequest, sandbox: Sandbox) -> Spawned:
    return Spawned(pid=await sandbox.spawn(body.cmd, env=body.env, cwd=body.cwd,
                                           user=body.user))


def _attach(sandbox: SandboxPort, pid: int) -> FramedResponse:
    async def run(outbox: Outbox) -> ExecDone:
        result = await sandbox.attach(
            pid, on_stdout=lambda data: _output(outbox, Kind.STDOUT, data),
            on_stderr=lambda data: _output(outbox, Kind.STDERR, data))
        return ExecDone.of(result)
    return FramedResponse(run)


@router.post("/processes/{pid}/attach", operation_id="attachProcess",
             response_class=FramedResponse,
             responses=framed_responses(ExecDone, "its buffered, then its new, output as "
                                                  "STDOUT and STDERR frames"))
async def attach_process(pid: int, sandbox: Sandbox) -> FramedResponse:
    return _attach(sandbox, pid)


@router.get("/processes", operation_id="listProcesses")
async def list_processes(sandbox: Sandbox) -> ProcessList:
    return ProcessList(processes=await sandbox.procs())


@router.post("/processes/{pid}/signal", status_code=204, operation_id="signalProcess")
async def signal_process(pid: int, body: SignalRequest, sandbox: Sandbox) -> Response:
    await sandbox.signal(pid, body.signal)
    return Response(status_code=204)


@router.post("/processes/{pid}/stdin", status_code=204, operation_id="sendStdin")
async def send_stdin(pid: int, body: StdinRequest, sandbox: Sandbox) -> Response:
    await sandbox.send_stdin(pid, body.data, eof=body.eof)
    return Response(status_code=204)
