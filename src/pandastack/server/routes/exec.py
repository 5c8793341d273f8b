"""Run a command and wait for it, or stream its output as Server-Sent Events."""

from __future__ import annotations

import asyncio
import codecs
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from pandastack.hostport.results import ExecResult as HostExecResult
from pandastack.wire.sandboxes import ExecRequest, ExecResult

from ..accounts.auth import CurrentPrincipal
from ..settings import Settings
from ..web.errors import ApiError, request_id_of
from ..web.jsonbody import StrictJsonRoute
from ..web.sse import SSE_RESPONSES, Finished, event_stream, failure_envelope, relayed, sse
from .deps import AppSettings, SandboxId, Service, check_text, to_exec_result

router = APIRouter(tags=["exec"], route_class=StrictJsonRoute)

STREAM_QUEUE_CHUNKS = 64

SSE_DESCRIPTION = """Server-Sent Events (`text/event-stream`):
`event: stdout` / `event: stderr` with data `{"data": "<utf-8 text>"}` while it runs,
then exactly one `event: exit` whose data is an ExecResult with empty stdout/stderr,
or one `event: error` whose data is the error envelope if the run fails mid-way."""


def _validate(body: ExecRequest, settings: Settings) -> int:
    """Checks the request; returns what to keep (or send) of each of stdout and stderr."""
    check_text(body.cmd, "cmd")
    check_text(body.env, "env")
    check_text(body.cwd, "cwd")
    most = settings.max_exec_output_bytes
    if body.max_output_bytes is None:
        return most
    if body.max_output_bytes > most:
        raise ApiError(422, "validation_error", f"max_output_bytes: at most {most} on this "
                                                f"server (PANDASTACK_MAX_EXEC_OUTPUT_MB)")
    return body.max_output_bytes


@router.post("/sandboxes/{sandbox_id}/exec", response_model=ExecResult,
             summary="Run a command and wait for it (timed_out=true on timeout, still 200)")
async def exec_command(sandbox_id: SandboxId, body: ExecRequest, who: CurrentPrincipal,
                       service: Service, settings: AppSettings) -> ExecResult:
    keep = _validate(body, settings)
    row, handle = await service.running(who.team, sandbox_id)
    env, cwd, user = service.call_context(row, body.env, body.cwd)
    with service.exec_slots.take(who.team):
        async with service.busy(row.id):
            result = await service.host_call(handle.exec(
                body.cmd, timeout=body.timeout_seconds, env=env, cwd=cwd, user=user,
                stdin=None if body.stdin is None else body.stdin.encode(), max_output=keep))
    return to_exec_result(result)


@router.post("/sandboxes/{sandbox_id}/exec/stream",
             operation_id="execCommandStream", summary="Run a command, stream its output",
             description=SSE_DESCRIPTION,
             responses=SSE_RESPONSES)
async def exec_stream(sandbox_id: SandboxId, body: ExecRequest, who: CurrentPrincipal,
                      service: Service, settings: AppSettings,
                      request: Request) -> StreamingResponse:
    keep = _validate(body, settings)
    rid = request_id_of(request)
    row, handle = await service.running(who.team, sandbox_id)
    env, cwd, user = service.call_context(row, body.env, body.cwd)
    # The limit bounds what is sent of each stream; past it output is counted and dropped.
    seen = {"stdout": 0, "stderr": 0}

    async def run(queue: asyncio.Queue[tuple[str, bytes] | None]) -> HostExecResult:
        async def forward(name: str, data: bytes) -> None:
            room = keep - seen[name]
            seen[name] += len(data)
            if room > 0:
                await queue.put((name, data[:room]))

        async def on_stdout(data: bytes) -> None:
            await forward("stdout", data)

        async def on_stderr(data: bytes) -> None:
            await forward("stderr", data)

        # The `exit` event carries no output, so the host keeps none (max_output=0).
        async with service.busy(row.id):
            return await handle.exec(
                body.cmd, timeout=body.timeout_seconds, env=env, cwd=cwd, user=user,
                stdin=None if body.stdin is None else body.stdin.encode(),
                on_stdout=on_stdout, on_stderr=on_stderr, max_output=0)

    async def events() -> AsyncIterator[bytes]:
        decoders = {name: codecs.getincrementaldecoder("utf-8")("replace")
                    for name in ("stdout", "stderr")}
        async for item in relayed(run, STREAM_QUEUE_CHUNKS):
            if not isinstance(item, Finished):
                text = decoders[item[0]].decode(item[1])
                if text:
                    yield sse(item[0], {"data": text})
                continue
            for name, decoder in decoders.items():
                tail = decoder.decode(b"", final=True)
                if tail:
                    yield sse(name, {"data": tail})
            if item.error is not None:
                yield sse("error", failure_envelope(item.error, rid, "exec stream"))
            elif item.result is not None:
                done = to_exec_result(item.result, with_output=False)
                done.truncated = max(seen.values()) > keep
                yield sse("exit", done.model_dump())

    release = service.exec_slots.acquire(who.team)  # 429 here, before the 200
    return event_stream(events(), release)
