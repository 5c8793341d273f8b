"""File watching as Server-Sent Events, and many files written in one request."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from pandastack.hostport.watch import WatchEvent
from pandastack.wire.sandboxes import FileEvent, WriteManyRequest, WriteManyResult, WriteResult

from ..accounts.auth import CurrentPrincipal
from ..web.errors import ApiError, clean_text, request_id_of
from ..web.jsonbody import StrictJsonRoute
from ..web.sse import SSE_RESPONSES, event_stream, failure_envelope, sse
from .deps import SandboxId, Service, check_path

router = APIRouter(tags=["files"], route_class=StrictJsonRoute)

KEEPALIVE_SECONDS = 15.0
"""A quiet watch sends an SSE comment this often, so idle proxies keep the connection."""
QUEUED_BATCHES = 4
"""Event batches (<= 64 KiB of JSON each) waiting for a slow client; then the host waits."""

FILE_WATCH_SSE = """**File watching** (`GET /v1/sandboxes/{id}/files/watch?path=&recursive=`) is a
Server-Sent Events stream: `watching` once the guest's inotify watch is set up, then one event
per change named by its type (`create`, `write`, `remove`, `rename` with `old_path`, `chmod`),
data a FileEvent, in the order the guest saw them; it ends with `overflow` (the client fell
behind and events were lost: list again and watch anew), `end` (the directory went away) or
`error`. Every hop's buffer is bounded (spec/file-watch.md, docs/adr/0029-file-watch.md)."""

WATCH_DESCRIPTION = """Server-Sent Events (`text/event-stream`), one per file event:
first `event: watching` (data `{"path", "recursive"}`) once the watch is set up in the guest:
what happens from then on is seen. Then, in the order the guest's inotify saw them, events
named by their type, `create`, `write`, `remove`, `rename` and `chmod`, each with data
`{"type", "path", "old_path", "is_dir"}` (a FileEvent; `old_path` only for `rename`, whose
`path` is the new name; a move into the tree is a `create`, out of it a `remove`). A run of
writes to one file is one `write`; with `recursive` (default) a new directory is followed and
what is already in it is told as `create`s.

The stream ends with exactly one of: `event: overflow` (events were lost because the client
read slower than they came and the guest's bounded queue filled: list the directory again
and start a new watch), `event: end` (data `{"reason": "removed"}`: the watched directory
went away), or `event: error` (the error envelope). Lines starting with `:` are
keep-alives. Errors before the stream starts (no such directory: 404, not a directory:
400) are ordinary error responses."""


def _event(e: WatchEvent) -> FileEvent:
    return FileEvent(type=e.type,  # type: ignore[arg-type]
                     path=clean_text(e.path),
                     old_path=None if e.old_path is None else clean_text(e.old_path),
                     is_dir=e.is_dir)


@router.get("/sandboxes/{sandbox_id}/files/watch", operation_id="watchFiles",
            summary="Watch a directory for file events (Server-Sent Events)",
            description=WATCH_DESCRIPTION, responses=SSE_RESPONSES,
            response_class=StreamingResponse)
async def watch_files(sandbox_id: SandboxId, who: CurrentPrincipal, service: Service,
                      request: Request,
                      path: Annotated[str, Query(min_length=1, max_length=4096,
                                                 description="a directory in the guest")],
                      recursive: Annotated[bool, Query()] = True) -> StreamingResponse:
    check_path(path)
    rid = request_id_of(request)
    row, handle = await service.running(who.team, sandbox_id)
    batches = handle.watch(path, recursive=recursive)
    try:  # the first step surfaces ENOENT & co. as a proper error response
        first = await anext(batches)
    except BaseException:
        with contextlib.suppress(Exception):
            await batches.aclose()  # type: ignore[attr-defined]
        raise
    root = clean_text(first[0].path) if first else path

    async def pull(queue: asyncio.Queue[list[WatchEvent] | BaseException | None]) -> None:
        try:
            async for batch in batches:
                await queue.put(batch)
            await queue.put(None)
        except Exception as exc:
            await queue.put(exc)
        finally:
            with contextlib.suppress(Exception):
                await batches.aclose()  # type: ignore[attr-defined]

    async def events() -> AsyncIterator[bytes]:
        queue: asyncio.Queue[list[WatchEvent] | BaseException | None] = asyncio.Queue(
            QUEUED_BATCHES)
        async with service.busy(row.id):
            task = asyncio.create_task(pull(queue))
            try:
                yield sse("watching", {"path": root, "recursive": recursive})
                while True:
                    try:
                        item = await asyncio.wait_for(queue.get(), KEEPALIVE_SECONDS)
                    except TimeoutError:
                        yield b": keep-alive\n\n"
                        continue
                    if item is None:
                        yield sse("end", {"reason": "removed"})
                        return
                    if isinstance(item, BaseException):
                        yield sse("error", failure_envelope(item, rid, "file watch"))
                        return
                    for e in item:
                        yield sse(e.type, _event(e).model_dump())
                        if e.type == "overflow":
                            return
            finally:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    release = service.stream_slots.acquire(who.team)  # 429 here, before the 200
    return event_stream(events(), release)


@router.post("/sandboxes/{sandbox_id}/files/batch", operation_id="writeFiles",
             response_model=WriteManyResult,
             summary="Write many files in one request (parents are created)",
             description="Each file's `data` is UTF-8 text or, with `encoding: base64`, "
                         "base64. Written in order; the first failure stops the batch with "
                         "its error (the files before it stay written). The whole body is "
                         "bounded by the JSON body limit (413 past it); more than "
                         "MAX_WRITE_MANY_FILES files, bad base64 or a NUL in a path are "
                         "422. For big files, use `PUT .../files` (streamed).")
async def write_files(sandbox_id: SandboxId, body: WriteManyRequest, who: CurrentPrincipal,
                      service: Service) -> WriteManyResult:
    decoded: list[tuple[str, bytes, int]] = []
    for i, f in enumerate(body.files):
        if "\x00" in f.path:
            raise ApiError(422, "validation_error", f"files[{i}].path must not contain NUL")
        if f.encoding == "base64":
            try:
                data = base64.b64decode(f.data, validate=True)
            except (binascii.Error, ValueError):
                raise ApiError(422, "validation_error",
                               f"files[{i}].data is not valid base64") from None
        else:
            data = f.data.encode()
        decoded.append((f.path, data, 0o644 if f.mode is None else f.mode))
    _, handle = await service.running(who.team, sandbox_id)
    written: list[WriteResult] = []
    async with service.busy(sandbox_id):
        for path, data, mode in decoded:
            size = await handle.write_file(path, data, mode=mode)
            written.append(WriteResult(path=path, size=size))
    return WriteManyResult(files=written)
