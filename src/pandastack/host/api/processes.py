"""Routes of a sandbox's streamed process output: exec, attach and spawn-attach (the rest of its
processes' routes are rows of the port's operation table: plain.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from pandastack.hostport.frames import Kind
from pandastack.hostport.host_api.codec import dump_json
from pandastack.hostport.host_api.models import (
    ExecDone,
    ExecRequest,
    Replay,
    SpawnAttachRequest,
    Spawned,
)
from pandastack.hostport.protocols import SandboxPort
from pandastack.rules import DEFAULT_EXEC_OUTPUT_MB

from .deps import Sandbox
from .framed import FramedResponse, Outbox, framed_responses

router = APIRouter(prefix="/sandboxes/{sandbox_id}", tags=["processes"])
OUTPUT_FRAMES = "STDOUT and STDERR frames as the process writes"


async def _output(outbox: Outbox, kind: Kind, data: bytes) -> None:
    await outbox.put(kind, data)


@router.post("/exec", operation_id="execCommand", response_class=FramedResponse,
             responses=framed_responses(ExecDone, OUTPUT_FRAMES))
async def exec_command(body: ExecRequest, sandbox: Sandbox) -> FramedResponse:
    # The caller keeps the output from the frames; the agent keeps none of it (max_output=0),
    # so an exec's output is held once, by the server, and only up to its limit. Whether
    # it went past the limit is counted here.
    keep = DEFAULT_EXEC_OUTPUT_MB << 20 if body.max_output is None else body.max_output
    sent = {Kind.STDOUT: 0, Kind.STDERR: 0}

    async def output(outbox: Outbox, kind: Kind, data: bytes) -> None:
        sent[kind] += len(data)
        await outbox.put(kind, data)

    async def run(outbox: Outbox) -> ExecDone:
        result = await sandbox.exec(
            body.cmd, timeout=body.timeout, env=body.env, cwd=body.cwd, stdin=body.stdin,
            user=body.user, on_stdout=lambda data: output(outbox, Kind.STDOUT, data),
            on_stderr=lambda data: output(outbox, Kind.STDERR, data), max_output=0)
        done = ExecDone.of(result)
        return done.model_copy(update={"truncated": max(sent.values()) > keep})
    return FramedResponse(run)


def _attach(sandbox: SandboxPort, pid: int, keep_output: bool) -> FramedResponse:
    async def run(outbox: Outbox) -> ExecDone:
        async def dropped(stdout: int, stderr: int) -> None:
            replay = Replay(stdout_dropped=stdout, stderr_dropped=stderr)
            await outbox.put(Kind.REPLAY, dump_json(replay))

        result = await sandbox.attach(
            pid, on_stdout=lambda data: _output(outbox, Kind.STDOUT, data),
            on_stderr=lambda data: _output(outbox, Kind.STDERR, data),
            on_dropped=dropped, keep_output=keep_output)
        return ExecDone.of(result)
    return FramedResponse(run)


@router.post("/processes/{pid}/attach", operation_id="attachProcess",
             response_class=FramedResponse,
             responses=framed_responses(ExecDone, "one REPLAY frame (what the guest's rings "
                                                  "dropped), then its buffered, then its new, "
                                                  "output as STDOUT and STDERR frames"))
async def attach_process(pid: int, sandbox: Sandbox,
                         keep_output: Annotated[bool, Query(
                             description="false: the RESULT's output is not kept (a stream "
                                         "of a long-lived process)")] = True,
                         ) -> FramedResponse:
    return _attach(sandbox, pid, keep_output)


@router.post("/processes/spawn-attach", operation_id="spawnAttachProcess",
             response_class=FramedResponse,
             responses=framed_responses(ExecDone, "one SPAWNED frame (the pid), then the "
                                                  "background process's output as STDOUT and "
                                                  "STDERR frames"))
async def spawn_attach_process(body: SpawnAttachRequest, sandbox: Sandbox) -> FramedResponse:
    async def run(outbox: Outbox) -> ExecDone:
        async def spawned(pid: int) -> None:
            await outbox.put(Kind.SPAWNED, dump_json(Spawned(pid=pid)))

        result = await sandbox.spawn_attach(
            body.cmd, on_spawned=spawned, env=body.env, cwd=body.cwd, user=body.user,
            timeout=body.timeout, stdin=body.stdin,
            on_stdout=lambda data: _output(outbox, Kind.STDOUT, data),
            on_stderr=lambda data: _output(outbox, Kind.STDERR, data),
            keep_output=body.keep_output)
        return ExecDone.of(result)
    return FramedResponse(run)
