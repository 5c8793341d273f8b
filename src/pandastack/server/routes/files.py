"""Files: streamed download and upload, list, stat, mkdir, remove, rename, and the searches
(`wire/search.py`'s rows)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse

from pandastack.hostport.results import FileInfo
from pandastack.wire import search
from pandastack.wire.sandboxes import FileEntry, FileList, MkdirRequest, RenameRequest, WriteResult

from ..accounts.auth import CurrentPrincipal
from ..sandboxes.service import SandboxService
from ..web.errors import ApiError, bad_request, clean_text
from ..web.jsonbody import StrictJsonRoute
from .deps import AppSettings, SandboxId, Service, check_path
from .operations import add_operations

router = APIRouter(tags=["files"], route_class=StrictJsonRoute)

FilePath = Annotated[str, Query(min_length=1, max_length=4096, description="path in the guest")]
OCTAL_MODE = re.compile(r"^(0o)?[0-7]{1,4}$")
FILE_TYPES = ("file", "dir", "symlink", "other")


def to_entry(info: FileInfo) -> FileEntry:
    kind = info.type if info.type in FILE_TYPES else "other"
    # a non-UTF-8 name in the guest arrives with surrogate escapes: shown with U+FFFD
    return FileEntry(name=clean_text(info.name), path=clean_text(info.path),
                     type=kind,  # type: ignore[arg-type]
                     size=info.size, mode=info.mode, mtime=info.mtime)


@router.get("/sandboxes/{sandbox_id}/files", response_class=StreamingResponse,
            summary="Download a file (raw bytes, streamed)",
            responses={200: {"content": {"application/octet-stream": {
                "schema": {"type": "string", "format": "binary"}}}}})
async def read_file(sandbox_id: SandboxId, path: FilePath, who: CurrentPrincipal,
                    service: Service) -> StreamingResponse:
    check_path(path)
    _, handle = await service.running(who.team, sandbox_id)
    chunks = handle.read_file(path)
    try:  # the first step surfaces ENOENT & co. as a proper error response
        first = await anext(chunks)
    except StopAsyncIteration:
        first = b""

    return StreamingResponse(held_chunks(service, sandbox_id, first, chunks),
                             media_type="application/octet-stream")


async def held_chunks(service: SandboxService, sandbox_id: str, first: bytes,
                      chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A download's body: `first` (already read, so that its errors were the answer's
    status), then the rest, the sandbox busy (the idle rule waits) until the last chunk."""
    async with service.busy(sandbox_id):
        try:
            if first:
                yield first
            async for chunk in chunks:
                yield chunk
        finally:
            with contextlib.suppress(Exception):
                await chunks.aclose()  # type: ignore[attr-defined]


@router.put("/sandboxes/{sandbox_id}/files", response_model=WriteResult,
            summary="Upload the raw request body to a file (streamed; parents are created)",
            description="`mode` is octal as for chmod (e.g. `644`, `0755`); default 644.",
            openapi_extra={"requestBody": {"content": {"application/octet-stream": {
                "schema": {"type": "string", "format": "binary"}}}}})
async def write_file(sandbox_id: SandboxId, path: FilePath, request: Request,
                     who: CurrentPrincipal, service: Service, settings: AppSettings,
                     mode: Annotated[str, Query(max_length=6)] = "644") -> WriteResult:
    check_path(path)
    if not OCTAL_MODE.match(mode):
        raise bad_request("mode must be octal, e.g. 644 or 0755")
    limit = settings.max_upload_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "payload_too_large", f"upload over the {limit}-byte limit")
    _, handle = await service.running(who.team, sandbox_id)

    async def body() -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in request.stream():
            seen += len(chunk)
            if seen > limit:
                raise ApiError(413, "payload_too_large", f"upload over the {limit}-byte limit")
            if chunk:
                yield chunk

    async with service.busy(sandbox_id):
        size = await handle.write_file(path, body(), mode=int(mode.removeprefix("0o"), 8))
    return WriteResult(path=path, size=size)


@router.get("/sandboxes/{sandbox_id}/files/list", response_model=FileList)
async def list_files(sandbox_id: SandboxId, path: FilePath, who: CurrentPrincipal,
                     service: Service) -> FileList:
    check_path(path)
    _, handle = await service.running(who.team, sandbox_id)
    return FileList(entries=[to_entry(i) for i in await handle.list_dir(path)])


@router.get("/sandboxes/{sandbox_id}/files/stat", response_model=FileEntry)
async def stat_file(sandbox_id: SandboxId, path: FilePath, who: CurrentPrincipal,
                    service: Service) -> FileEntry:
    check_path(path)
    _, handle = await service.running(who.team, sandbox_id)
    return to_entry(await handle.stat(path))


@router.post("/sandboxes/{sandbox_id}/files/mkdir",
             operation_id="makeDirectory", status_code=204, response_class=Response)
async def make_dir(sandbox_id: SandboxId, body: MkdirRequest, who: CurrentPrincipal,
                   service: Service) -> Response:
    check_path(body.path)
    _, handle = await service.running(who.team, sandbox_id)
    await handle.mkdir(body.path, parents=body.parents)
    return Response(status_code=204)


@router.delete("/sandboxes/{sandbox_id}/files",
               operation_id="deleteFile", status_code=204, response_class=Response)
async def remove_file(sandbox_id: SandboxId, path: FilePath, who: CurrentPrincipal,
                      service: Service, recursive: Annotated[bool, Query()] = False) -> Response:
    check_path(path)
    _, handle = await service.running(who.team, sandbox_id)
    await handle.remove(path, recursive=recursive)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/files/rename", status_code=204, response_class=Response)
async def rename_file(sandbox_id: SandboxId, body: RenameRequest, who: CurrentPrincipal,
                      service: Service) -> Response:
    check_path(body.src, "src")
    check_path(body.dst, "dst")
    _, handle = await service.running(who.team, sandbox_id)
    await handle.rename(body.src, body.dst)
    return Response(status_code=204)


# The searches: request/response operations, built from their rows.
add_operations(router, search)
