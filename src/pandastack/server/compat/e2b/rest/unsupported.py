"""What E2B's API has and pandastack does not: an E2B-shaped 501 saying so, and what to use
instead. Every other path under E2B's prefixes that no route serves is an E2B-shaped 404
(or 405 for a method a path does not take), never our /v1 envelope. Registered after the
routes (rest/__init__.py): the first route that matches path and method wins."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..errors import e2b_response
from .base import E2bRoute

router = APIRouter(route_class=E2bRoute, include_in_schema=False)

ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]

NOT_HERE: tuple[tuple[str, str], ...] = (
    ("/sandboxes/{sandbox_id}/logs", "sandbox logs through E2B's API are not supported by "
     "pandastack; GET /v1/sandboxes/{id}/logs has the console and agent lines"),
    ("/v2/sandboxes/{sandbox_id}/logs", "sandbox logs through E2B's API are not supported by "
     "pandastack; GET /v1/sandboxes/{id}/logs has the console and agent lines"),
    ("/templates", "E2B's template API is not supported by pandastack; build and list "
     "templates with /v1/templates (`pandastack template build`)"),
    ("/v2/templates", "E2B's template API is not supported by pandastack; build and list "
     "templates with /v1/templates (`pandastack template build`)"),
    ("/v3/templates", "E2B's template API is not supported by pandastack; build and list "
     "templates with /v1/templates (`pandastack template build`)"),
    ("/secrets", "secrets are not supported by pandastack; pass envVars at create"),
    ("/volumes", "E2B's volumes API is not supported by pandastack; manage volumes with "
     "/v1/volumes (a create's volumeMounts mounts them by name)"),
    ("/teams", "E2B's teams API is not supported by pandastack; a key's team is managed "
     "with /v1/keys and /v1/teams"),
    ("/access-tokens", "access tokens are not supported by pandastack; use API keys (/v1/keys)"),
    ("/api-keys", "E2B's API-key API is not supported by pandastack; manage keys with "
     "/v1/keys"),
)
# Paths that are E2B's by their prefix: nothing under them is ours to answer as /v1 does.
E2B_PREFIXES = ("/sandboxes", "/v2", "/v3", "/snapshots", "/nodes")


def _not_supported(message: str):  # type: ignore[no-untyped-def]
    async def endpoint() -> Response:
        return e2b_response(501, message)
    return endpoint


async def no_route(request: Request) -> Response:
    return e2b_response(404, f"no E2B route {request.method} {request.url.path}")


for path, message in NOT_HERE:
    for form in (path, path + "/{rest:path}"):
        router.add_api_route(form, _not_supported(message), methods=ALL_METHODS,
                             name=f"e2b-unsupported:{form}")
for prefix in E2B_PREFIXES:
    for form in (prefix, prefix + "/{rest:path}"):
        router.add_api_route(form, no_route, methods=ALL_METHODS, name=f"e2b-none:{form}")
