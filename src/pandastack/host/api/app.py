"""`create_host_app`: the host API (spec/host-openapi.json) over one host port, as the
`pandastack agent` process serves it. Every route but /health needs the agent's token."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute

from pandastack._version import __version__
from pandastack.host.memory.admission import MemoryAdmission
from pandastack.hostport.frames import MEDIA_TYPE
from pandastack.hostport.host_api.codec import ErrorEnvelope
from pandastack.hostport.host_api.models import HostStatus
from pandastack.hostport.protocols import RuntimePort
from pandastack.metrics_access import MetricsAccess, scrape
from pandastack.tracing import TracingMiddleware

from . import code, files, plain, processes, pty, templates, watch
from .auth import require_token
from .deps import Host
from .errors import WireJSONResponse, install_handlers
from .telemetry import AgentMetrics, LatencyMiddleware

API_PREFIX = "/v1"
# Every route may answer one of these (a streamed one only before its stream starts; after
# that its failure is the stream's ERROR frame).
ERROR_RESPONSES: dict[int | str, dict[str, object]] = {
    "4XX": {"description": "refused: an ErrorEnvelope naming the error's class",
            "content": {"application/json": {"schema": {
                "$ref": "#/components/schemas/ErrorEnvelope"}}}},
    "5XX": {"description": "failed: an ErrorEnvelope naming the error's class",
            "content": {"application/json": {"schema": {
                "$ref": "#/components/schemas/ErrorEnvelope"}}}},
}


def operation_id(route: APIRoute) -> str:
    """Every route names its operationId (`operation_id=`); this only catches one that
    forgot, with the camelCase of its function's name."""
    first, *rest = route.name.split("_")
    return first + "".join(word.capitalize() for word in rest)


def _host_router() -> APIRouter:
    router = APIRouter(prefix=API_PREFIX, dependencies=[Depends(require_token)],
                       responses=ERROR_RESPONSES)

    @router.get("/host", operation_id="getHostStatus", tags=["host"],
                responses={401: {"model": ErrorEnvelope}})
    async def get_host_status(host: Host) -> HostStatus:
        return HostStatus(sandboxes=len(await host.list_sandboxes()))

    router.include_router(plain.router())
    for module in (processes, files, watch, code, templates):
        router.include_router(module.router)
    return router


def create_host_app(host: RuntimePort, token: str, *, manage_host: bool = False,
                    metrics_access: MetricsAccess | None = None,
                    admission: MemoryAdmission | None = None) -> FastAPI:
    """The app over `host`, answering requests that carry `Authorization: Bearer <token>`.
    With `manage_host`, the app's lifespan starts the host and closes it (as the agent
    process runs it); otherwise its caller does. `metrics_access`: who may read /metrics
    (None: nobody, 404). `admission`: the runtime's memory admission, whose reserve and
    reservations /metrics shows."""
    if not token:
        raise ValueError("the host API needs a non-empty token")

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if manage_host:
            await host.start()
        try:
            yield
        finally:
            if manage_host:
                await host.close()

    app = FastAPI(title="pandastack host agent", version=__version__, lifespan=lifespan,
                  redirect_slashes=False, generate_unique_id_function=operation_id,
                  default_response_class=WireJSONResponse,
                  description="The host API: what the control plane asks of one host "
                              "(pandastack.hostport.protocols). Streamed bodies are "
                              "frames (pandastack.hostport.frames); errors are an "
                              "ErrorEnvelope naming a class of pandastack.hostport.errors.")
    app.state.host = host
    app.state.token = token.encode()
    install_handlers(app)

    @app.get("/health", operation_id="getHealth", tags=["host"])
    async def get_health() -> dict[str, str]:
        return {"status": "ok"}

    agent_metrics = AgentMetrics(admission)
    access = metrics_access or MetricsAccess(loopback=False)
    app.add_middleware(LatencyMiddleware, metrics=agent_metrics)
    # Each call a span named by its operationId, the child of the control plane's
    # `traceparent` (ADR 0049; a no-op while off).
    app.add_middleware(TracingMiddleware, by_operation=True)

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics(request: Request) -> Response:
        return await scrape(request, agent_metrics.registry, access,
                            lambda: agent_metrics.refresh(host))

    app.include_router(_host_router())
    app.include_router(pty.ws_router)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, with the streamed results' schemas as plain references (it
    merges them into the `{"type": "string"}` it gives any non-JSON response)."""
    if app.openapi_schema is None:
        document = get_openapi(
            title=app.title, version=app.version, openapi_version=app.openapi_version,
            description=app.description, routes=app.routes,
            separate_input_output_schemas=app.separate_input_output_schemas)
        for operations in document["paths"].values():
            for operation in operations.values():
                content = operation.get("responses", {}).get("200", {}).get("content", {})
                schema = content.get(MEDIA_TYPE, {}).get("schema", {})
                if "$ref" in schema:
                    content[MEDIA_TYPE]["schema"] = {"$ref": schema["$ref"]}
        app.openapi_schema = document
    return app.openapi_schema
