"""A sandbox's activity time, written to the store at most once per `TOUCH_COALESCE_SECONDS`.

Every call on a sandbox bumps `last_activity_at` (when it starts, and again when a long one
ends, so the idle reaper leaves it alone). A call in a warm sandbox takes tens of ms, so an
UPDATE per bump was two store writes per request; the reaper compares that time with idle
timeouts of whole seconds (at least 1 s), which a time up to this much older cannot fool."""

from __future__ import annotations

import time

from ..store import Store

TOUCH_COALESCE_SECONDS = 0.25
# Past this many remembered sandboxes the memo starts over (ended ones are forgotten by
# `forget`; this bounds what a missed forget could leave behind).
MAX_REMEMBERED = 100_000


class ActivityTouches:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._written: dict[str, float] = {}  # sandbox id -> the activity time last written

    def touch(self, sandbox_id: str, now: float | None = None) -> None:
        """Record activity at `now` (default: the time now), unless this process wrote one
        for the sandbox less than `TOUCH_COALESCE_SECONDS` before it."""
        now = time.time() if now is None else now
        last = self._written.get(sandbox_id)
        if last is not None and 0 <= now - last < TOUCH_COALESCE_SECONDS:
            return
        self.store.touch(sandbox_id, now)
        self.written(sandbox_id, now)

    def written(self, sandbox_id: str, at: float) -> None:
        """The sandbox's row was just written with activity time `at` (by its create)."""
        if len(self._written) >= MAX_REMEMBERED:
            self._written.clear()
        self._written[sandbox_id] = at

    def forget(self, sandbox_id: str) -> None:
        self._written.pop(sandbox_id, None)
