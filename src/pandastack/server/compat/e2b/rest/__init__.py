"""E2B's REST API (spec/openapi.yml of e2b-dev/E2B) over SandboxService: `router`, which
app.py mounts without a prefix and outside our OpenAPI contract."""

from __future__ import annotations

from fastapi import APIRouter

from . import routes, unsupported

router = APIRouter(include_in_schema=False)
router.include_router(routes.router)
router.include_router(unsupported.router)  # after the routes: it takes what they do not
