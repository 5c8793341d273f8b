"""E2B's `filesystem.Filesystem` service (stub: filled in by its own change)."""

from __future__ import annotations

from .connect import Method

METHODS: dict[str, Method] = {}
