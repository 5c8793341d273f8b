"""Routes of a sandbox's code interpreter: a run's events streamed, and the code contexts."""

from __future__ import annotations

import contextlib

from fastapi import APIRouter, Response

from pandastack.hostport.frames import Kind
from pandastack.hostport.wire import (
    CodeContext,
    CodeContextList,
    CodeContextRequest,
    CodeEventModel,
    RunCodeRequest,
    RunDone,
    dump_json,
)

from .deps import Sandbox
from .framed import FramedResponse, Outbox, framed_responses

router = APIRouter(prefix="/sandboxes/{sandbox_id}/code", tags=["code"])


@router.post("/run", operation_id="runCode", response_class=FramedResponse,
             responses=framed_responses(RunDone, "one EVENT frame (a CodeEventModel) per "
                                                 "event, the last of type \"end\""))
async def run_code(body: RunCodeRequest, sandbox: Sandbox) -> FramedResponse:
    async def run(outbox: Outbox) -> RunDone:
        count = 0
        events = sandbox.run_code(body.code, language=body.language,
                                  context_id=body.context_id, timeout=body.timeout,
                                  env=body.env)
        async with contextlib.aclosing(events) as stream:  # type: ignore[type-var]
            async for event in stream:
                count += 1
                await outbox.put(Kind.EVENT, dump_json(CodeEventModel.of(event)))
        return RunDone(events=count)
    return FramedResponse(run)


@router.post("/contexts", status_code=201, operation_id="createCodeContext")
async def create_code_context(body: CodeContextRequest, sandbox: Sandbox) -> CodeContext:
    return CodeContext(context=await sandbox.create_code_context(body.language, body.cwd))


@router.get("/contexts", operation_id="listCodeContexts")
async def list_code_contexts(sandbox: Sandbox) -> CodeContextList:
    return CodeContextList(contexts=await sandbox.list_code_contexts())


@router.delete("/contexts/{context_id}", status_code=204, operation_id="deleteCodeContext")
async def delete_code_context(context_id: str, sandbox: Sandbox) -> Response:
    await sandbox.delete_code_context(context_id)
    return Response(status_code=204)


@router.post("/contexts/{context_id}/restart", status_code=204,
             operation_id="restartCodeContext")
async def restart_code_context(context_id: str, sandbox: Sandbox) -> Response:
    await sandbox.restart_code_context(context_id)
    return Response(status_code=204)
