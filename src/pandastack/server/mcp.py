"""The MCP tools at `/mcp` (streamable HTTP), behind the REST API's own auth (docs/adr/0032).

Each request is authenticated here as every REST request is (Bearer or X-API-Key, the rate
limit), then served by the MCP package's session manager, stateless: any API server answers
any request, as for the REST API. A tool acts through the SDK on the caller's key against this
same app, in process (httpx's ASGI transport): the same routes, auth, team scoping, quotas and
errors as the REST API and the stdio transport, with no second code path.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import httpx
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from pandastack.sdk import AsyncClient

from .accounts.auth import key_from_headers, principal
from .web.errors import ApiError, error_response

if TYPE_CHECKING:
    from mcp.server.mcpserver import Context

__all__ = ["MCP_PATH", "McpEndpoint"]

MCP_PATH = "/mcp"
_CALLER = "pandastack.mcp.caller"


class _Caller:
    def __init__(self, app: ASGIApp, api_url: str, key: str,
                 client: tuple[str, int] | None) -> None:
        self.app = app
        self.api_url = api_url
        self.key = key
        self.client = client


def _caller_of(ctx: Context) -> _Caller:
    request: Any = ctx.request_context.request
    caller = request.scope.get(_CALLER) if isinstance(request, Request) else None
    if not isinstance(caller, _Caller):
        raise RuntimeError("an MCP call reached the tools without passing /mcp's auth")
    return caller


@contextlib.asynccontextmanager
async def _client(ctx: Context) -> AsyncIterator[AsyncClient]:
    caller = _caller_of(ctx)
    # The app's public URL as base: the Host the routes see is the one their URLs name.
    # The caller's address too: the inner calls' logs and forwarded headers name the
    # client, not this server.
    transport = (httpx.ASGITransport(app=caller.app, client=caller.client) if caller.client
                 else httpx.ASGITransport(app=caller.app))
    async with AsyncClient(caller.api_url, caller.key, transport=transport) as client:
        yield client


class McpEndpoint:
    """The ASGI app of `/mcp`; `running()` belongs in the API app's lifespan. The MCP package
    is imported, and its session manager started, on the first request: most servers never
    get one, and the import costs most of a second at every start."""

    def __init__(self, api_url: str) -> None:
        self.api_url = api_url
        self._active = False
        self._manager: Any = None
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._starting: asyncio.Lock | None = None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        self._active = True
        try:
            yield
        finally:
            self._active = False
            task, stop = self._task, self._stop
            self._manager = self._task = self._stop = self._starting = None
            if task is not None and stop is not None:
                stop.set()
                await task

    async def _started(self) -> Any:
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._manager is None:
                await self._start()
        return self._manager

    async def _start(self) -> None:
        from mcp.server.transport_security import TransportSecuritySettings

        from pandastack.mcp.tools import build_server

        server = build_server(_client)
        # A session manager runs once: a new one for each start of the app. It runs in a task
        # of its own: its task group must be left by the task that entered it, and the
        # request that starts it ends long before the app does.
        server.streamable_http_app(
            stateless_http=True, json_response=True,
            # Browsers never send the Bearer key by themselves, so a rebound name gets
            # nothing the auth below does not already refuse.
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
        manager = server.session_manager
        started, stop = asyncio.Event(), asyncio.Event()

        async def run() -> None:
            async with manager.run():
                started.set()
                await stop.wait()

        task = asyncio.create_task(run(), name="pandastack-mcp")
        ready = asyncio.create_task(started.wait())
        await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
        if not started.is_set():
            ready.cancel()
            await task  # raises what stopped it
        self._manager, self._task, self._stop = manager, task, stop

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        if not self._active:
            await error_response(request, 503, "unavailable", "starting")(scope, receive, send)
            return
        try:
            await principal(request)
        except ApiError as exc:
            response = error_response(request, exc.status, exc.code, exc.message, exc.headers)
            await response(scope, receive, send)
            return
        key = key_from_headers(request)
        assert key is not None  # principal() refused a request without one
        client = scope.get("client")
        scope[_CALLER] = _Caller(scope["app"], self.api_url, key,
                                 (str(client[0]), int(client[1])) if client else None)
        manager = await self._started()
        await manager.handle_request(scope, receive, send)
