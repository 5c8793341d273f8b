"""The route of a code run: its events streamed (the code contexts' routes are rows of the
port's operation table: plain.py)."""

from __future__ import annotations

import contextlib

from fastapi import APIRouter

from pandastack.hostport.frames import Kind
from pandastack.hostport.host_api.codec import dump_json
from pandastack.hostport.host_api.models import RunCodeRequest, RunDone
from pandastack.hostport.results import CodeEvent

from .deps import Sandbox
from .framed import FramedResponse, Outbox, framed_responses

router = APIRouter(prefix="/sandboxes/{sandbox_id}/code", tags=["code"])


@router.post("/run", operation_id="runCode", response_class=FramedResponse,
             responses=framed_responses(RunDone, f"one EVENT frame (a {CodeEvent.__name__}) "
                                                 "per event, the last of type \"end\""))
async def run_code(body: RunCodeRequest, sandbox: Sandbox) -> FramedResponse:
    async def run(outbox: Outbox) -> RunDone:
        count = 0
        events = sandbox.run_code(body.code, language=body.language,
                                  context_id=body.context_id, timeout=body.timeout,
                                  env=body.env)
        async with contextlib.aclosing(events) as stream:  # type: ignore[type-var]
            async for event in stream:
                count += 1
                await outbox.put(Kind.EVENT, dump_json(event))
        return RunDone(events=count)
    return FramedResponse(run)
