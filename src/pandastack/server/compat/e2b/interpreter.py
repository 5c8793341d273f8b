"""E2B's code interpreter (port 49999: /execute, /contexts) over ours (stub)."""

from __future__ import annotations

from starlette.routing import BaseRoute

ROUTES: list[BaseRoute] = []
