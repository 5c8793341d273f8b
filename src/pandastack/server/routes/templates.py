"""Team templates: build (in the background, inside a microVM), follow a build's log, list,
show and delete versions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import StreamingResponse

from pandastack.rules import BUILTIN_TEMPLATE_NAMES, DEFAULT_TEMPLATE
from pandastack.wire.resources import (
    BuildTemplate,
    BuiltinTemplateInfo,
    TemplateBuildInfo,
    TemplateInfo,
    TemplateList,
)

from ..accounts.auth import CurrentPrincipal
from ..sandboxes.templates import TemplateService, to_build_info
from ..web.jsonbody import StrictJsonRoute
from ..web.sse import SSE_RESPONSES, event_stream, sse
from .links import links

router = APIRouter(tags=["templates"], route_class=StrictJsonRoute)

TemplateName = Annotated[str, Path(max_length=64, description="template name")]
BuildId = Annotated[str, Path(max_length=64, description="build id, e.g. tb-0123456789ab")]

LOG_DESCRIPTION = """Server-Sent Events (`text/event-stream`): every line so far as
`event: log` with data `{"line": "..."}`, then (while the build runs) each new line as it comes,
then exactly one `event: status` whose data is the build's TemplateBuildInfo."""


async def get_templates(request: Request) -> TemplateService:
    templates: TemplateService = request.app.state.templates
    return templates


Templates = Annotated[TemplateService, Depends(get_templates)]


@router.post("/templates", response_model=TemplateBuildInfo, status_code=202,
             responses=links(202, ("getTemplateBuild",), {"build_id": "$response.body#/build_id"}),
             summary="Build a new version of a template (runs in the background)")
async def build_template(body: BuildTemplate, who: CurrentPrincipal,
                         templates: Templates) -> TemplateBuildInfo:
    return to_build_info(await templates.start_build(who.team, body))


# The default first, then by name: the order `pandastack template list` prints them in.
BUILTIN = [BuiltinTemplateInfo(name=name, default=name == DEFAULT_TEMPLATE)
           for name in sorted(BUILTIN_TEMPLATE_NAMES, key=lambda n: (n != DEFAULT_TEMPLATE, n))]


@router.get("/templates", response_model=TemplateList,
            summary="The team's templates (the newest version of each name) and the "
                    "built-in ones")
async def list_templates(who: CurrentPrincipal, templates: Templates) -> TemplateList:
    rows = await templates.newest(who.team)
    return TemplateList(templates=[to_build_info(row) for row in rows],
                        builtin=[b.model_copy() for b in BUILTIN])


@router.get("/templates/{name}", response_model=TemplateInfo,
            summary="A template's versions, oldest first")
async def get_template(name: TemplateName, who: CurrentPrincipal,
                       templates: Templates) -> TemplateInfo:
    rows = await templates.versions(who.team, name)
    return TemplateInfo(name=name, versions=[to_build_info(r) for r in rows])


@router.delete("/templates/{name}", status_code=204,
               summary="Delete a template (all versions, or `version`); running sandboxes "
                       "created from it keep running")
async def delete_template(name: TemplateName, who: CurrentPrincipal, templates: Templates,
                          version: Annotated[int | None, Query(ge=1)] = None) -> None:
    await templates.delete(who.team, name, version)


@router.get("/templates/builds/{build_id}",
            operation_id="getTemplateBuild", response_model=TemplateBuildInfo,
            summary="A build's status")
async def get_build(build_id: BuildId, who: CurrentPrincipal,
                    templates: Templates) -> TemplateBuildInfo:
    return to_build_info(await templates.build_row(who.team, build_id))


@router.get("/templates/builds/{build_id}/logs",
            operation_id="getTemplateBuildLogs", summary="Follow a build's log",
            description=LOG_DESCRIPTION,
            responses=SSE_RESPONSES)
async def build_logs(build_id: BuildId, who: CurrentPrincipal,
                     templates: Templates) -> StreamingResponse:
    await templates.build_row(who.team, build_id)  # 404 before the stream starts

    async def events() -> AsyncIterator[bytes]:
        async for line in templates.follow_logs(who.team, build_id):
            yield sse("log", {"line": line})
        final = await templates.build_row(who.team, build_id)
        yield sse("status", to_build_info(final).model_dump())

    return event_stream(events())
