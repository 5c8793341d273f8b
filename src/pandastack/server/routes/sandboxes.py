"""Create, list, get and kill sandboxes."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from pandastack.wire import ENDED_STATES, CreateSandbox, SandboxInfo, SandboxList, SandboxState

from ..auth import CurrentPrincipal
from ..errors import bad_request
from ..hosts.pinning import pinned_to
from ..jsonbody import StrictJsonRoute
from ..store.listing import BadPageToken, SandboxFilter
from .deps import SandboxId, Service

router = APIRouter(tags=["sandboxes"], route_class=StrictJsonRoute)

METADATA_FILTER = "metadata."
MAX_PAGE = 1000


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
            summary="List the team's sandboxes; filter with state=, template=, "
                    "started_after=, metadata.KEY=VALUE; page with limit= and next_token=",
            description="Oldest first. Without `limit` every match comes in one answer; with "
                        "it, at most `limit` and a `next_token` (null on the last page) to "
                        "pass back, with the same filters, for the next page. Pages are "
                        "keyset-paged on (created_at, id): sandboxes created or ended "
                        "meanwhile never shift a page, so none is skipped or repeated; one "
                        "whose state changes may move in or out of a state= filter.")
async def list_sandboxes(request: Request, who: CurrentPrincipal, service: Service,
                         state: Annotated[SandboxState | None, Query()] = None,
                         include_ended: Annotated[bool, Query(
                             description="false: only live sandboxes (starting, running, "
                                         "paused, hibernated); ignored with state=")] = True,
                         template: Annotated[str | None, Query(max_length=128)] = None,
                         started_after: Annotated[float | None, Query(
                             description="only those created after this (Unix seconds)")
                         ] = None,
                         limit: Annotated[int | None, Query(ge=1, le=MAX_PAGE)] = None,
                         next_token: Annotated[str | None, Query(max_length=512)] = None,
                         ) -> SandboxList:
    wanted: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if name.startswith(METADATA_FILTER):
            key = name[len(METADATA_FILTER):]
            if not key:
                raise bad_request("metadata filter needs a key: metadata.KEY=VALUE")
            wanted[key] = value
    where = SandboxFilter(state=state, template=template, started_after=started_after,
                          metadata=wanted,
                          exclude_states=tuple(ENDED_STATES)
                          if state is None and not include_ended else ())
    try:
        rows, token = service.store.page_sandboxes(who.team, where, limit=limit,
                                                   after=next_token)
    except BadPageToken as exc:
        raise bad_request(str(exc)) from None
    return SandboxList(sandboxes=service.infos(rows), next_token=token)


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
