"""Routes of templates on this host: prepare a built-in one, build one from a spec (its log
streamed), prune the build step cache."""

from __future__ import annotations

from fastapi import APIRouter, Response

from pandastack.hostport.frames import Kind
from pandastack.hostport.wire import (
    BuildRequest,
    BuildResultModel,
    PrepareTemplateRequest,
    Pruned,
    PruneRequest,
    network_of,
)

from .deps import Host
from .framed import FramedResponse, Outbox, framed_responses

router = APIRouter(prefix="/templates", tags=["templates"])


@router.post("/{name}/prepare", status_code=204, operation_id="prepareTemplate")
async def prepare_template(name: str, body: PrepareTemplateRequest, host: Host) -> Response:
    await host.prepare_template(name, vcpus=body.vcpus, memory_mb=body.memory_mb)
    return Response(status_code=204)


@router.post("/builds", operation_id="buildTemplate", response_class=FramedResponse,
             responses=framed_responses(BuildResultModel, "one LOG frame per line of the "
                                                          "build's log"))
async def build_template(body: BuildRequest, host: Host) -> FramedResponse:
    async def run(outbox: Outbox) -> BuildResultModel:
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

        result = await host.build_template(body.spec, log=log, network=network_of(body.network),
                                           vcpus=body.vcpus, memory_mb=body.memory_mb,
                                           cache_scope=body.cache_scope)
        return BuildResultModel.of(result)
    return FramedResponse(run)


@router.post("/build-cache/prune", operation_id="pruneBuildCache")
async def prune_build_cache(body: PruneRequest, host: Host) -> Pruned:
    return Pruned(deleted=await host.prune_build_cache(body.keep_newest))
