"""A background process's output as Server-Sent Events: what the guest's rings still hold,
then live output, then its exit (ADR 0030). Any number of clients may follow one process,
each from the start of the rings; leaving a stream never touches the process."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.responses import StreamingResponse

from pandastack.hostport.results import ExecResult as HostExecResult

from ..accounts.auth import CurrentPrincipal
from ..web.errors import api_error_of, request_id_of
from ..web.jsonbody import StrictJsonRoute
from ..web.sse import SSE_RESPONSES, Finished, event_stream, failure_envelope, relayed, sse
from .deps import SandboxId, Service, to_exec_result

router = APIRouter(tags=["processes"], route_class=StrictJsonRoute)

Pid = Annotated[int, Path(ge=1, le=2**31 - 1)]
STREAM_QUEUE_ITEMS = 64
KEEPALIVE_SECONDS = 15.0
# ("stdout" | "stderr", bytes) as written, or ("dropped", {"stdout": n, "stderr": m}).
Item = tuple[str, bytes | dict[str, int]]

PROCESS_STREAM_SSE = """**Background output** (`GET /v1/sandboxes/{id}/processes/{pid}/stream`) is a
Server-Sent Events stream of a process started with `POST .../processes` (optionally with
`timeout_seconds`): `dropped` if the guest's rings (the last 1 MiB of each stream) already lost
its start, the replay of what they hold (all of stdout, then all of stderr), live `stdout` and
`stderr` events, then one `exit` (an ExecResult, `timed_out` when its timeout killed it) or
`error`. Any number of clients may follow one process; leaving detaches
(docs/adr/0030-background-output-and-lifecycle.md)."""

STREAM_DESCRIPTION = """Server-Sent Events (`text/event-stream`), for a process started with
`POST /processes` (or a foreground exec whose client went away). Attach at any time, from any
number of clients:

1. `event: dropped` with data `{"stdout": N, "stderr": M}`, only if the guest's ring buffers
   (the last 1 MiB of each stream) already lost the first N / M bytes: the replay below is then
   the tail of the output, not all of it.
2. The replay: `event: stdout` / `event: stderr` with data `{"data": "<utf-8 text>"}`, first
   all of stdout the ring holds, then all of stderr (their interleaving is not kept).
3. Live output, as the process writes it, in the same events.
4. Exactly one `event: exit` whose data is an ExecResult with empty stdout/stderr
   (`timed_out: true` if its `timeout_seconds` killed it), or one `event: error` with the
   error envelope. A process that has already exited gives its replay and exit at once.

A comment line (`: keepalive`) comes after every 15 s without an event, so that nothing in
between closes a quiet stream. Closing the stream detaches; the process keeps running. An
unknown pid is a 404 before the stream starts. Backpressure: a client that stops reading stops
the guest process on its pipe (as for exec/stream), so read promptly or disconnect."""


@router.get("/sandboxes/{sandbox_id}/processes/{pid}/stream",
            operation_id="streamProcess",
            summary="Replay a background process's buffered output, then follow it live",
            description=STREAM_DESCRIPTION, responses=SSE_RESPONSES)
async def stream_process(sandbox_id: SandboxId, pid: Pid, who: CurrentPrincipal,
                         service: Service, request: Request) -> StreamingResponse:
    rid = request_id_of(request)
    row, handle = await service.running(who.team, sandbox_id)

    async def run(queue: asyncio.Queue[Item | None]) -> HostExecResult:
        async def on_stdout(data: bytes) -> None:
            await queue.put(("stdout", data))

        async def on_stderr(data: bytes) -> None:
            await queue.put(("stderr", data))

        async def on_dropped(stdout: int, stderr: int) -> None:
            await queue.put(("dropped", {"stdout": stdout, "stderr": stderr}))

        async with service.busy(row.id):
            return await handle.attach(pid, on_stdout=on_stdout, on_stderr=on_stderr,
                                       on_dropped=on_dropped, keep_output=False)

    items = relayed(run, STREAM_QUEUE_ITEMS)
    # The guest opens every attach with its replay note, so the first item comes at once:
    # waiting for it before the 200 makes an unknown pid (or a host that is down) a plain
    # error response instead of an error event.
    first = await anext(items)
    if isinstance(first, Finished) and first.error is not None:
        await items.aclose()
        api = api_error_of(first.error)
        if api is None:
            raise first.error
        raise api from None

    async def events() -> AsyncIterator[bytes]:
        decoders = {name: codecs.getincrementaldecoder("utf-8")("replace")
                    for name in ("stdout", "stderr")}
        async for item in _chain(first, items):
            if item is None:
                # A quiet process sends nothing for hours: proxies and NATs in between close
                # a silent connection, so say something (an SSE comment) now and then.
                yield b": keepalive\n\n"
                continue
            if not isinstance(item, Finished):
                name, value = item
                if isinstance(value, bytes):
                    text = decoders[name].decode(value)
                    if text:
                        yield sse(name, {"data": text})
                elif any(value.values()):
                    yield sse(name, value)
                continue
            for name, decoder in decoders.items():
                tail = decoder.decode(b"", final=True)
                if tail:
                    yield sse(name, {"data": tail})
            if item.error is not None:
                yield sse("error", failure_envelope(item.error, rid, "process stream"))
            elif item.result is not None:
                # Nothing was kept for the result: the stream itself carried all of it.
                done = to_exec_result(item.result, with_output=False)
                yield sse("exit", done.model_copy(update={"truncated": False}).model_dump())

    release = service.stream_slots.acquire(who.team)  # 429 here, before the 200
    return event_stream(events(), release)


async def _chain(first: Item | Finished[HostExecResult],
                 rest: AsyncGenerator[Item | Finished[HostExecResult], None],
                 keepalive: float = KEEPALIVE_SECONDS,
                 ) -> AsyncGenerator[Item | Finished[HostExecResult] | None, None]:
    """`first`, then what `rest` yields; None whenever `rest` has been quiet for `keepalive`
    seconds (the item awaited is never cancelled for it, only when the stream is left)."""
    pending: asyncio.Future[Item | Finished[HostExecResult]] | None = None
    try:
        yield first
        while True:
            pending = asyncio.ensure_future(anext(rest))
            while not (await asyncio.wait({pending}, timeout=keepalive))[0]:
                yield None
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        await rest.aclose()
