"""The FastAPI application factory. The lifespan starts the host (in this process, or a
`pandastack agent` reached over the host API; either re-adopts running VMs), reconciles it with
the store, makes the first admin key, and runs the reaper."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.routing import Route

from pandastack._version import __version__
from pandastack.hostport.errors import HostUnavailable
from pandastack.hostport.protocols import RuntimePort
from pandastack.metrics_access import MetricsAccess, scrape
from pandastack.tracing import TracingMiddleware
from pandastack.wire.pty import PTY_WEBSOCKET
from pandastack.wire.sandboxes import ErrorEnvelope

from .accounts.ratelimit import RateLimiter
from .bootstrap import ensure_admin_key, private_database
from .compat.e2b.rest import router as e2b_rest
from .dashboard import DashboardMiddleware
from .events.log import EventContextMiddleware
from .events.webhooks import WebhookService
from .events.webhooks import running as webhooks_running
from .mcp import MCP_PATH, McpEndpoint
from .preview.signing import UrlSigner, redact_signatures_in_logs
from .registries.service import RegistryCredentialService
from .routes import (
    code,
    files,
    keys,
    lifecycle,
    metrics,
    network,
    ports,
    processes,
    pty,
    sandboxes,
    snapshots,
    state,
    watch,
)
from .routes import events as event_routes
from .routes import exec as exec_routes
from .routes import hosts as host_routes
from .routes import registries as registry_routes
from .routes import streams as stream_routes
from .routes import templates as template_routes
from .routes import usage as usage_routes
from .routes import volumes as volume_routes
from .routes import webhooks as webhook_routes
from .routes.ports import PortProxy
from .routes.streams import PROCESS_STREAM_SSE
from .routes.watch import FILE_WATCH_SSE
from .sandboxes.lifecycle import hibernate_persistent, reaper
from .sandboxes.service import SandboxService
from .sandboxes.templates import TemplateService
from .settings import Settings
from .store import Store, open_store
from .store.events_log import EventLog
from .web.body_limits import BodyLimitMiddleware
from .web.errors import ApiError, RequestIdMiddleware, install_handlers
from .web.telemetry import MetricsContextMiddleware, ServerMetrics

log = logging.getLogger("pandastack.server")

API_PREFIX = "/v1"


class Health(BaseModel):
    status: str


def operation_id(route: APIRoute) -> str:
    """A route's OpenAPI operationId: its endpoint's name in camelCase (`create_sandbox`:
    `createSandbox`), or the `operation_id=` a route sets where its function's name would not
    read as the operation. FastAPI's default (`create_sandbox_v1_sandboxes_post`) would change
    with every path and leak into every generated client."""
    first, *rest = route.name.split("_")
    return first + "".join(word.capitalize() for word in rest)


def default_host(settings: Settings, store: Store) -> RuntimePort:
    """The host the server drives when the caller gives none: the agents the database's
    registry names (`settings.cluster`), the agent `settings.agent` names (a pool of them
    when it names several), or else one composed in this process."""
    if not settings.cluster and settings.agent is None:
        from .embedded import embedded_host
        return embedded_host(settings)
    from .hostclient import HostClient, agent_tls, read_token
    tls = None
    if settings.agent_ca is not None or settings.agent_client_cert is not None:
        tls = agent_tls(settings.agent_ca, settings.agent_client_cert,
                        settings.agent_client_key)
    if settings.cluster:
        from .hosts.cluster import ClusterPool
        if settings.agent_token_file is None:
            raise ValueError("a cluster's agents share one token: set --agent-token-file "
                             "(PANDASTACK_AGENT_TOKEN_FILE)")
        token = read_token(settings.agent_token_file)
        return ClusterPool(store, lambda endpoint: HostClient(endpoint, token, tls=tls),
                           stale_after_s=settings.host_stale_seconds)
    clients: dict[str, RuntimePort] = {
        address: HostClient(address, read_token(settings.agent_token_file, address), tls=tls)
        for address in settings.agents}
    if len(clients) == 1:
        return next(iter(clients.values()))
    from .hosts.pool import HostPool
    return HostPool(clients)


def create_app(settings: Settings | None = None, runtime: RuntimePort | None = None) -> FastAPI:
    """Build the app. With `runtime` given, the caller owns it: the app starts it (start() is
    idempotent re-adoption) but never closes it."""
    settings = settings or Settings.from_env()
    owns_runtime = runtime is None
    redact_signatures_in_logs()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        private_database(settings.dsn)
        store = open_store(settings.dsn)
        rt: RuntimePort = runtime if runtime is not None else default_host(settings, store)
        task: asyncio.Task[None] | None = None
        service: SandboxService | None = None
        templates: TemplateService | None = None
        proxy: PortProxy | None = None
        try:
            service = SandboxService(store, rt, settings)
            server_metrics.bind(service)
            registries = RegistryCredentialService(store, settings.encryption_key_path)
            app.state.registries = registries
            templates = TemplateService(service, cache_entries=settings.build_cache_entries,
                                        max_concurrent=settings.max_concurrent_builds,
                                        max_per_team=settings.max_builds_per_team,
                                        registries=registries)

            async def reconcile() -> None:
                await rt.start()
                failed, killed = await service.reconcile()
                if failed or killed:
                    log.warning("reconciled after start: %d rows failed, %d stray VMs killed",
                                len(failed), len(killed))
                await templates.reconcile()
                await service.volumes.snapshots.finish_moves()

            try:
                await reconcile()
            except HostUnavailable as exc:
                # Serve anyway: requests for its sandboxes answer 503 host_unavailable, and
                # the reaper reconciles as soon as the host answers.
                log.warning("the host is out of reach at startup (%s)", exc)
                service.needs_reconcile = True
            service.templates = templates
            app.state.templates = templates
            ensure_admin_key(store, settings)
            proxy = PortProxy(settings, UrlSigner.for_server(store, settings))
            app.state.port_proxy = proxy
            app.state.store = store
            app.state.service = service
            app.state.ready = True
            task = asyncio.create_task(reaper(service, reconcile), name="pandastack-reaper")
            app.state.webhooks = WebhookService(EventLog(store), settings)
            async with mcp_endpoint.running(), webhooks_running(app.state.webhooks):
                yield
        finally:
            app.state.ready = False
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if templates is not None:
                await templates.close()
            if proxy is not None:
                await proxy.aclose()
            if owns_runtime and settings.hibernate_on_stop and service is not None:
                await hibernate_persistent(service)
            if owns_runtime:
                await rt.close()
            store.close()

    app = FastAPI(title="pandastack", version=__version__, lifespan=lifespan,
                  redirect_slashes=False, generate_unique_id_function=operation_id,
                  description="Self-hostable microVM sandboxes. Every error response is "
                              "`{\"error\": {code, message, request_id}}`; every response "
                              "carries `X-Request-Id`. A JSON body over the server's limit "
                              "(`PANDASTACK_MAX_BODY_KB`, default 1 MiB) gets 413 before it is "
                              "read; raw uploads (files, stdin) have their own, larger limit."
                              "\n\n" + PTY_WEBSOCKET + "\n\n" + FILE_WATCH_SSE
                              + "\n\n" + PROCESS_STREAM_SSE)
    app.state.settings = settings
    app.state.ready = False
    app.state.metrics = server_metrics = ServerMetrics()
    app.state.rate_limiter = RateLimiter(settings.rate_limit_per_second,
                                         settings.rate_limit_burst)
    install_handlers(app)
    # The last one added is the outermost: the request id exists before a body is refused.
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes,
                       max_upload_bytes=settings.max_upload_bytes,
                       max_template_bytes=settings.max_template_bytes)
    app.add_middleware(RequestIdMiddleware)
    app.add_middleware(MetricsContextMiddleware, metrics=server_metrics)
    app.add_middleware(EventContextMiddleware)  # the caller that events name as their actor
    # /dashboard: outermost, so what it forwards to /v1 meets every layer above once.
    app.add_middleware(DashboardMiddleware)
    # Outermost of all: a request's span covers every layer (ADR 0049; a no-op while off).
    app.add_middleware(TracingMiddleware)
    access = MetricsAccess.of(settings.host)

    @app.get("/health", response_model=Health, tags=["health"])
    async def health() -> Health:
        if not app.state.ready:
            raise ApiError(503, "unavailable", "starting")
        return Health(status="ok")

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics(request: Request) -> Response:
        store: Store | None = getattr(app.state, "store", None)
        return await scrape(request, server_metrics.registry, access, lambda: (
            server_metrics.refresh(store, cluster=settings.cluster,
                                   local=settings.agent is None)))

    mcp_endpoint = McpEndpoint(settings.api_url)
    app.router.routes.append(Route(MCP_PATH, mcp_endpoint, methods=["GET", "POST", "DELETE"],
                                   include_in_schema=False))

    for module in (sandboxes, state, snapshots, exec_routes, code, processes, watch, files,
                   lifecycle, network, ports, keys, template_routes, host_routes, usage_routes,
                   volume_routes, stream_routes, pty,
                   metrics, event_routes, webhook_routes, registry_routes):
        app.include_router(module.router, prefix=API_PREFIX,
                           responses={"default": {"model": ErrorEnvelope,
                                                  "description": "error envelope"}})
    app.include_router(e2b_rest, include_in_schema=False)  # E2B's shapes, not our contract
    return app
