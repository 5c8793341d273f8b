"""The event log as the API serves it: the stream behind `GET /v1/events`, the per-team bound
on open streams, the middleware that gives each request its `Caller` (and writes the
`quota.exceeded` events its rolled-back transactions could not), and pruning."""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from pandastack.wire.events import TRUNCATED_EVENT

from ..store import Store
from ..store.events import Caller, caller
from ..store.events_log import EventLog
from ..web.errors import ApiError

#: How often an open stream looks for new events (every server writes to the one log, so
#: the store is the only place that knows of them all).
POLL_SECONDS = 0.5
#: A quiet stream sends an SSE comment this often, so idle proxies keep the connection.
KEEPALIVE_SECONDS = 15.0
#: Pruning runs at most this often (the reaper ticks every second).
PRUNE_EVERY_SECONDS = 30.0

_last_prune: weakref.WeakKeyDictionary[Store, float] = weakref.WeakKeyDictionary()


def frame(event_id: int | None, event: str, data: object) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def stream(log: EventLog, team: str, resume: int | None,
                 patterns: Sequence[str] | None,
                 global_ids: bool = False) -> AsyncIterator[bytes]:
    """`ready` (data `{"after": id}`), then each event after the resume point as it is
    written (SSE id = event id: the team's number, or with `global_ids`, for admin keys,
    the log's id). A resume point pruned from the log is told first with `events.truncated`
    (data `{"after", "oldest", "pruned_through"}`), and the stream starts at the oldest
    event kept."""
    scope = None if global_ids else team
    at = await asyncio.to_thread(log.head, scope)
    if resume is not None:
        # A team number past the team's newest was never handed out (a global id kept
        # from before the team sequences, or made up): the stream starts now, and `ready`
        # says so.
        at = resume if global_ids else min(resume, at)
        pruned = await asyncio.to_thread(log.pruned_through, scope)
        if at < pruned:
            oldest = await asyncio.to_thread(log.oldest, team, global_ids)
            yield frame(None, TRUNCATED_EVENT, {"after": at, "oldest": oldest,
                                                "pruned_through": pruned})
            at = pruned
    yield frame(None, "ready", {"after": at})
    quiet_since = time.monotonic()
    while True:
        events, at = await asyncio.to_thread(log.after, team, at, patterns,
                                             global_ids=global_ids)
        for e in events:
            yield frame(e["id"], e["type"], e)
        if events:
            quiet_since = time.monotonic()
            continue
        if time.monotonic() - quiet_since >= KEEPALIVE_SECONDS:
            yield b": keep-alive\n\n"
            quiet_since = time.monotonic()
        await asyncio.sleep(POLL_SECONDS)


class StreamSlots:
    """Open event streams per team on this server, bounded."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open: dict[str, int] = {}

    def take(self, team: str) -> Callable[[], None]:
        """One of the team's slots (429 when none is free); call what it returns, once, to
        give it back."""
        if self.open.get(team, 0) >= self.limit:
            raise ApiError(429, "rate_limited", f"team {team!r} has {self.limit} event "
                           "streams open on this server already: close one first")
        self.open[team] = self.open.get(team, 0) + 1

        def release() -> None:
            self.open[team] -= 1
            if not self.open[team]:
                del self.open[team]
        return release


def record_quota_events(store: Store, events: list[dict[str, Any]]) -> None:
    log = EventLog(store)
    for data in events:
        data = dict(data)
        log.record(data.pop("team"), "quota.exceeded", who=data.pop("actor"), **data)


class EventContextMiddleware:
    """Gives every request its `Caller` (the auth dependency fills it in: the actor of the
    events its state changes write), and writes the request's quota.exceeded events once
    it is answered."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        who = Caller()
        token = caller.set(who)
        try:
            await self.app(scope, receive, send)
        finally:
            caller.reset(token)
            store = getattr(scope["app"].state, "store", None) if "app" in scope else None
            if who.quota_events and store is not None:
                await asyncio.to_thread(record_quota_events, store, who.quota_events)


def prune(store: Store, now: float, retention_seconds: float) -> None:
    """Drop what is older than the retention window (at most every PRUNE_EVERY_SECONDS)."""
    if now - _last_prune.get(store, 0.0) < PRUNE_EVERY_SECONDS:
        return
    _last_prune[store] = now
    EventLog(store).prune(now - retention_seconds)
