"""Create, list, get and kill sandboxes."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from pandastack.wire import ENDED_STATES, CreateSandbox, SandboxInfo, SandboxList, SandboxState

from ..auth import CurrentPrincipal
from ..errors import bad_request
from ..hosts.pinning import pinned_to
from ..jsonbody import StrictJsonRoute
from .deps import SandboxId, Service

router = APIRouter(tags=["sandboxes"], route_class=StrictJsonRoute)

METADATA_FILTER = "metadata."


@router.post("/sandboxes", status_code=201, response_model=SandboxInfo,
             summary="Create a sandbox from a template, or from a snapshot of the team",
             description="With `snapshot`, the new sandbox resumes the snapshotted memory, "
                         "processes and files; its template, vcpus and memory_mb are the "
                         "snapshot's (naming others is a 422). An unknown snapshot, or another "
                         "team's, is a 404.")
async def create_sandbox(body: CreateSandbox, who: CurrentPrincipal,
                         service: Service) -> SandboxInfo:
    with pinned_to(body.host_id, admin=who.admin):
        return service.info(await service.create(who.team, body))


@router.get("/sandboxes", response_model=SandboxList,
            summary="List the team's sandboxes; filter with state= and metadata.KEY=VALUE")
async def list_sandboxes(request: Request, who: CurrentPrincipal, service: Service,
                         state: Annotated[SandboxState | None, Query()] = None,
                         include_ended: Annotated[bool, Query(
                             description="false: only live sandboxes (starting, running, "
                                         "paused, hibernated); ignored with state=")] = True,
                         ) -> SandboxList:
    wanted: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if name.startswith(METADATA_FILTER):
            key = name[len(METADATA_FILTER):]
            if not key:
                raise bad_request("metadata filter needs a key: metadata.KEY=VALUE")
            wanted[key] = value
    rows = service.store.list_sandboxes(who.team, state)
    if state is None and not include_ended:
        rows = [r for r in rows if r.state not in ENDED_STATES]
    rows = [r for r in rows if all((r.meta or {}).get(k) == v for k, v in wanted.items())]
    return SandboxList(sandboxes=service.infos(rows))


@router.get("/sandboxes/{sandbox_id}", response_model=SandboxInfo)
async def get_sandbox(sandbox_id: SandboxId, who: CurrentPrincipal,
                      service: Service) -> SandboxInfo:
    return service.info(service.row(who.team, sandbox_id))


@router.delete("/sandboxes/{sandbox_id}", status_code=204, response_class=Response,
               summary="Kill a sandbox (204 also when it had already ended)")
async def delete_sandbox(sandbox_id: SandboxId, who: CurrentPrincipal,
                         service: Service) -> Response:
    await service.delete(who.team, sandbox_id)
    return Response(status_code=204)
