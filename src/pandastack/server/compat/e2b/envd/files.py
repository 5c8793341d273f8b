"""E2B daemon's plain HTTP routes: /files, /health, /envs, /metrics (stub)."""

from __future__ import annotations

from starlette.routing import BaseRoute

ROUTES: list[BaseRoute] = []
