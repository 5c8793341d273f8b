"""The route of a template build: its log streamed, then its result (preparing a built-in
template and pruning the step cache are rows of the port's operation table: plain.py)."""

from __future__ import annotations

from fastapi import APIRouter

from pandastack.hostport.frames import Kind
from pandastack.hostport.host_api.models import BuildRequest, port_value
from pandastack.hostport.results import BuildResult

from .deps import Host
from .framed import FramedResponse, Outbox, framed_responses

router = APIRouter(prefix="/templates", tags=["templates"])


@router.post("/builds", operation_id="buildTemplate", response_class=FramedResponse,
             responses=framed_responses(BuildResult, "one LOG frame per line of the "
                                                     "build's log"))
async def build_template(body: BuildRequest, host: Host) -> FramedResponse:
    async def run(outbox: Outbox) -> BuildResult:
        dropped = 0

        def log(line: str) -> None:
            # The builder's log callback cannot wait: lines are dropped (and counted) only
            # when the control plane is megabytes behind.
            nonlocal dropped
            if dropped and outbox.offer(Kind.LOG, f"[{dropped} log lines dropped: the "
                                                  "reader fell behind]".encode()):
                dropped = 0
            if dropped or not outbox.offer(Kind.LOG, line.encode()):
                dropped += 1

        return await host.build_template(body.spec, log=log, network=port_value(body.network),
                                         vcpus=body.vcpus, memory_mb=body.memory_mb,
                                         cache_scope=body.cache_scope,
                                         registry_logins=port_value(body.registry_logins))
    return FramedResponse(run)
