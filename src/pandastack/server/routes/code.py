"""The code interpreter: run code in a sandbox's kernel (state kept between runs), wait for the
`Execution` or stream its events; create, list, restart and delete code contexts."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator

from fastapi import APIRouter, Path, Request
from fastapi.responses import StreamingResponse

from pandastack.hostport.protocols import SandboxPort
from pandastack.hostport.results import CodeEvent
from pandastack.wire.sandboxes import (
    CodeContext,
    CodeContextList,
    CodeError,
    CodeResult,
    CreateCodeContext,
    Execution,
    RunCode,
)

from ..accounts.auth import CurrentPrincipal
from ..web.errors import ApiError, clean_text, request_id_of
from ..web.jsonbody import StrictJsonRoute
from ..web.sse import SSE_RESPONSES, Finished, event_stream, failure_envelope, relayed, sse
from .deps import SandboxId, Service, check_text
from .links import links

router = APIRouter(tags=["code"], route_class=StrictJsonRoute)

ContextId = Path(max_length=64, description="code context id")
STREAM_QUEUE_EVENTS = 64

SSE_DESCRIPTION = """Server-Sent Events (`text/event-stream`), in the order the kernel
produced them: `event: stdout` / `event: stderr` with data `{"data": "<text>"}`,
`event: result` with a CodeResult, `event: error` with a CodeError (the code raised),
then exactly one `event: end` with `{"execution_count": n}`. If the run itself fails (the
sandbox is gone, the template has no code interpreter...), the stream ends with one
`event: failure` whose data is the error envelope."""


class Collector:
    """Folds code events into one `Execution`. What a run may produce is bounded by the code
    client (results, their size, output text: AgentLimitError, a 413); text is kept as text,
    not one object per event, so a run of tiny events costs what its characters do."""

    def __init__(self) -> None:
        self.stdout = io.StringIO()
        self.stderr = io.StringIO()
        self.results: list[CodeResult] = []
        self.error: CodeError | None = None
        self.execution_count: int | None = None

    def add(self, event: CodeEvent) -> None:
        if event.type == "stdout":
            self.stdout.write(event.text)
        elif event.type == "stderr":
            self.stderr.write(event.text)
        elif event.type == "result":
            self.results.append(to_result(event))
        elif event.type == "error":
            self.error = to_error(event)
        elif event.type == "end":
            self.execution_count = event.execution_count

    def execution(self) -> Execution:
        return Execution(stdout=clean_text(self.stdout.getvalue()),
                         stderr=clean_text(self.stderr.getvalue()), results=self.results,
                         error=self.error, execution_count=self.execution_count)


def to_result(event: CodeEvent) -> CodeResult:
    return CodeResult(data={clean_text(k): clean_text(v) for k, v in (event.data or {}).items()},
                      is_main_result=event.is_main_result)


def to_error(event: CodeEvent) -> CodeError:
    return CodeError(name=clean_text(event.name), value=clean_text(event.value),
                     traceback=clean_text(event.traceback))


def event_frame(event: CodeEvent) -> bytes | None:
    if event.type in ("stdout", "stderr"):
        return sse(event.type, {"data": clean_text(event.text)})
    if event.type == "result":
        return sse("result", to_result(event).model_dump())
    if event.type == "error":
        return sse("error", to_error(event).model_dump())
    if event.type == "end":
        return sse("end", {"execution_count": event.execution_count})
    return None  # an event type this server does not know: not passed on


def _validate(body: RunCode) -> None:
    check_text(body.env, "env")
    if "\x00" in body.code:
        raise ApiError(400, "bad_request", "code must not contain NUL bytes")


async def _events(handle: SandboxPort, body: RunCode) -> AsyncIterator[CodeEvent]:
    async for event in handle.run_code(body.code, language=body.language,
                                       context_id=body.context_id,
                                       timeout=body.timeout_seconds, env=body.env or None):
        yield event


@router.post("/sandboxes/{sandbox_id}/code", response_model=Execution,
             summary="Run code in the sandbox's kernel and wait for the Execution "
                     "(an exception in the code is `error`, still 200)")
async def run_code(sandbox_id: SandboxId, body: RunCode, who: CurrentPrincipal,
                   service: Service) -> Execution:
    _validate(body)
    row, handle = await service.running(who.team, sandbox_id)
    collector = Collector()
    async with service.busy(row.id):
        async def collect() -> None:
            async for event in _events(handle, body):
                collector.add(event)
        await service.host_call(collect())
    return collector.execution()


@router.post("/sandboxes/{sandbox_id}/code/stream", summary="Run code, stream its events",
             description=SSE_DESCRIPTION,
             responses=SSE_RESPONSES)
async def run_code_stream(sandbox_id: SandboxId, body: RunCode, who: CurrentPrincipal,
                          service: Service, request: Request) -> StreamingResponse:
    _validate(body)
    rid = request_id_of(request)
    row, handle = await service.running(who.team, sandbox_id)

    async def run(queue: asyncio.Queue[CodeEvent | None]) -> None:
        async with service.busy(row.id):
            async for event in _events(handle, body):
                await queue.put(event)

    async def frames() -> AsyncIterator[bytes]:
        async for item in relayed(run, STREAM_QUEUE_EVENTS):
            if isinstance(item, Finished):
                if item.error is not None:
                    yield sse("failure", failure_envelope(item.error, rid, "code stream"))
            elif (frame := event_frame(item)) is not None:
                yield frame

    return event_stream(frames())


def to_context(data: dict[str, object]) -> CodeContext:
    cwd = data.get("cwd")
    return CodeContext(id=str(data.get("id", "")), language=str(data.get("language", "")),
                       cwd=None if cwd is None else str(cwd))


@router.post("/sandboxes/{sandbox_id}/code/contexts",
             operation_id="createCodeContext", response_model=CodeContext,
             responses=links(201, ("deleteCodeContext", "restartCodeContext"),
                             {"sandbox_id": "$request.path.sandbox_id",
                              "context_id": "$response.body#/id"}),
             status_code=201, summary="Create a code context (its own kernel and state)")
async def create_context(sandbox_id: SandboxId, body: CreateCodeContext,
                         who: CurrentPrincipal, service: Service) -> CodeContext:
    if body.cwd is not None:
        check_text(body.cwd, "cwd")
    row, handle = await service.running(who.team, sandbox_id)
    async with service.busy(row.id):
        data = await service.host_call(handle.create_code_context(body.language, body.cwd))
    return to_context(data)


@router.get("/sandboxes/{sandbox_id}/code/contexts",
            operation_id="listCodeContexts", response_model=CodeContextList,
            summary="List the sandbox's code contexts")
async def list_contexts(sandbox_id: SandboxId, who: CurrentPrincipal,
                        service: Service) -> CodeContextList:
    _, handle = await service.running(who.team, sandbox_id)
    items = await service.host_call(handle.list_code_contexts())
    return CodeContextList(contexts=[to_context(item) for item in items])


@router.post("/sandboxes/{sandbox_id}/code/contexts/{context_id}/restart",
             operation_id="restartCodeContext", status_code=204,
             summary="Restart a code context's kernel (its state is lost)")
async def restart_context(sandbox_id: SandboxId, who: CurrentPrincipal, service: Service,
                          context_id: str = ContextId) -> None:
    row, handle = await service.running(who.team, sandbox_id)
    async with service.busy(row.id):
        await service.host_call(handle.restart_code_context(context_id))


@router.delete("/sandboxes/{sandbox_id}/code/contexts/{context_id}",
               operation_id="deleteCodeContext", status_code=204,
               summary="Delete a code context and stop its kernel")
async def delete_context(sandbox_id: SandboxId, who: CurrentPrincipal, service: Service,
                         context_id: str = ContextId) -> None:
    _, handle = await service.running(who.team, sandbox_id)
    await service.host_call(handle.delete_code_context(context_id))
