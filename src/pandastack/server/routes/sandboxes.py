"""Create, list, get and kill sandboxes; get or create one by name (server/sandboxes/names.py)."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response

from pandastack.rules import SANDBOX_ID_RE, SANDBOX_NAME_PATTERN
from pandastack.wire.sandboxes import (
    ENDED_STATES,
    CreateSandbox,
    SandboxInfo,
    SandboxList,
    SandboxState,
)

from ..accounts.auth import CurrentPrincipal
from ..hosts.pinning import pinned_to
from ..store.listing import BadPageToken, SandboxFilter
from ..web.errors import ApiError, bad_request
from ..web.jsonbody import StrictJsonRoute
from .deps import SandboxId, Service
from .links import merged, sandbox_links

router = APIRouter(tags=["sandboxes"], route_class=StrictJsonRoute)

METADATA_FILTER = "metadata."
MAX_PAGE = 1000


@router.post("/sandboxes", status_code=201, response_model=SandboxInfo,
             responses=sandbox_links(201),
             summary="Create a sandbox from a template, or from a snapshot of the team",
             description="With `snapshot`, the new sandbox resumes the snapshotted memory, "
                         "processes and files; its template, vcpus and memory_mb are the "
                         "snapshot's (naming others is a 422). An unknown snapshot, or another "
                         "team's, is a 404.")
async def create_sandbox(body: CreateSandbox, who: CurrentPrincipal,
                         service: Service) -> SandboxInfo:
    with pinned_to(body.host_id, admin=who.admin):
        return service.created_info(await service.create(who.team, body), body)


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


@router.get("/sandboxes/{sandbox_id}", response_model=SandboxInfo,
            summary="A sandbox, by id or by the team's name for a live one")
async def get_sandbox(sandbox_id: SandboxId, who: CurrentPrincipal,
                      service: Service) -> SandboxInfo:
    # An id, or the team's name for a live sandbox (a name never has an id's form).
    if not SANDBOX_ID_RE.match(sandbox_id) and SANDBOX_NAME_RE.match(sandbox_id):
        named = service.names.live(who.team, sandbox_id)
        if named is not None:
            return service.info(named)
    return service.info(service.row(who.team, sandbox_id))


SANDBOX_NAME_RE = re.compile(SANDBOX_NAME_PATTERN)
SandboxName = Annotated[str, Path(pattern=SANDBOX_NAME_PATTERN,
                                  description="the team's name for the sandbox")]


@router.get("/sandboxes/by-name/{name}", response_model=SandboxInfo,
            summary="The team's live sandbox of that name (404 if none)")
async def get_sandbox_by_name(name: SandboxName, who: CurrentPrincipal,
                              service: Service) -> SandboxInfo:
    return service.info(service.names.row(who.team, name))


@router.put("/sandboxes/by-name/{name}", response_model=SandboxInfo,
            responses=merged({201: {"model": SandboxInfo, "description": "made now"}},
                             sandbox_links((200, 201))),
            summary="Get or create the team's sandbox of that name",
            description="200 with the live sandbox of that name (a hibernated one woken; one "
                        "still starting once it has started), else 201 with a new one made "
                        "with the body's options (those of `POST /v1/sandboxes`; `name`, if "
                        "given, must be the path's). Concurrent calls with one name get one "
                        "sandbox. An ended sandbox frees its name: the next call makes a new "
                        "one.")
async def get_or_create_sandbox(name: SandboxName, body: CreateSandbox,
                                who: CurrentPrincipal, service: Service,
                                response: Response) -> SandboxInfo:
    if SANDBOX_ID_RE.match(name):
        raise ApiError(422, "validation_error", "name: a name must not have a sandbox id's "
                       "form (sbx-<12 hex>)")
    if body.name is not None and body.name != name:
        raise ApiError(422, "validation_error", "name: the body names another sandbox than "
                       "the path")
    with pinned_to(body.host_id, admin=who.admin):
        row, made = await service.names.get_or_create(who.team, name, body)
    response.status_code = 201 if made else 200
    return service.info(row)


@router.delete("/sandboxes/{sandbox_id}", status_code=204, response_class=Response,
               summary="Kill a sandbox (204 also when it had already ended)")
async def delete_sandbox(sandbox_id: SandboxId, who: CurrentPrincipal,
                         service: Service) -> Response:
    await service.delete(who.team, sandbox_id)
    return Response(status_code=204)
