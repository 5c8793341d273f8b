"""Routes of a sandbox's file bodies, streamed both ways: a read is DATA frames (so that a
failure midway is told, not mistaken for the end of the file); a write is the raw request
body, handed to the guest chunk by chunk as it arrives. The other file routes are rows of
the port's operation table (plain.py)."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request

from pandastack.guestproto.ops import WRITE_FILE_MODE
from pandastack.hostport.frames import Kind
from pandastack.hostport.host_api.models import ReadDone, Written

from .deps import Sandbox
from .framed import FramedResponse, Outbox, framed_responses

router = APIRouter(prefix="/sandboxes/{sandbox_id}/files", tags=["files"])
Path = Query(description="an absolute path in the guest")
MODE_BITS = 0o7777
"""A mode's permission bits with setuid, setgid and sticky: what chmod(2) sets."""
RAW_BODY = {"requestBody": {"required": True, "content": {"application/octet-stream": {
    "schema": {"type": "string", "format": "binary"}}}}}


@router.get("/content", operation_id="readFile", response_class=FramedResponse,
            responses=framed_responses(ReadDone, "the file's bytes in DATA frames"))
async def read_file(sandbox: Sandbox, path: str = Path) -> FramedResponse:
    async def run(outbox: Outbox) -> ReadDone:
        size = 0
        async for chunk in sandbox.read_file(path):
            size += len(chunk)
            await outbox.put(Kind.DATA, chunk)
        return ReadDone(size=size)
    return FramedResponse(run)


@router.put("/content", operation_id="writeFile", openapi_extra=RAW_BODY)
async def write_file(request: Request, sandbox: Sandbox, path: str = Path,
                     mode: int = Query(WRITE_FILE_MODE, ge=0, le=MODE_BITS)) -> Written:
    return Written(size=await sandbox.write_file(path, request.stream(), mode=mode))
