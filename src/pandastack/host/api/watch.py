"""The route of a file watch: the guest's event batches as EVENT frames (a WatchBatch each,
the first `[watching]`), then a RESULT frame (WatchDone). The Outbox bounds what waits for
a slow control plane; behind it the guest-agent channel's credit stops the guest, whose own
bounded queue then ends the watch in `overflow` (docs/adr/0029-file-watch.md)."""

from __future__ import annotations

import contextlib

from fastapi import APIRouter, Query

from pandastack.hostport.frames import Kind
from pandastack.hostport.host_api.codec import dump_json
from pandastack.hostport.host_api.models import WatchBatch, WatchDone

from .deps import Sandbox
from .framed import FramedResponse, Outbox, framed_responses

router = APIRouter(prefix="/sandboxes/{sandbox_id}/files", tags=["files"])


@router.get("/watch", operation_id="watchFiles", response_class=FramedResponse,
            responses=framed_responses(WatchDone, "EVENT frames of a WatchBatch each, the "
                                       "first [watching], the last [overflow] if events "
                                       "were lost"))
async def watch_files(sandbox: Sandbox,
                      path: str = Query(description="an absolute directory in the guest"),
                      recursive: bool = True) -> FramedResponse:
    async def run(outbox: Outbox) -> WatchDone:
        reason = "ended"
        batches = sandbox.watch(path, recursive=recursive)
        try:
            async for batch in batches:
                if batch and batch[-1].type == "overflow":
                    reason = "overflow"
                body = WatchBatch(events=list(batch))
                await outbox.put(Kind.EVENT, dump_json(body))
        finally:
            close = getattr(batches, "aclose", None)
            if close is not None:  # stop the guest's watch now, not when collected
                with contextlib.suppress(Exception):
                    await close()
        return WatchDone(reason=reason)
    return FramedResponse(run)
