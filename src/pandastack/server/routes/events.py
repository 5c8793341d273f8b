"""`GET /v1/events`: the team's event log as Server-Sent Events, resumable."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from pandastack.wire.events import EVENT_TYPES, valid_pattern

from ..accounts.auth import CurrentPrincipal
from ..events.log import StreamSlots, stream
from ..store.events_log import EventLog
from ..web.errors import ApiError
from ..web.jsonbody import StrictJsonRoute
from ..web.sse import SSE_RESPONSES, event_stream
from .deps import Service
from .keys import TEAM_RE

router = APIRouter(tags=["events"], route_class=StrictJsonRoute)

EVENTS_DESCRIPTION = f"""Server-Sent Events of the team's event log, oldest first: first
`event: ready` (data `{{"after": id}}`: events after that id follow), then one SSE message per
event, `id:` the event's id, `event:` its type, data the event (`id`, `type`, `time`, `team`,
`actor`: the API key id or `system`, `sandbox_id`, `template`, and the type's own fields).
Types: {", ".join(EVENT_TYPES)}.

Ids are the team's own sequence (1, 2, 3, ...: other teams' events do not move them). An
admin key's stream, of its own team or another, uses the log's global ids instead (`id`;
the team's number is in `seq`), and resumes by them.

Resume with `Last-Event-ID` (what EventSource sends on reconnect) or `since` (an event id;
the header wins): events after it follow. Without either the stream starts now. A resume
point older than the log's retention (`PANDASTACK_EVENT_RETENTION`, default 24 h) is not an
error: the stream starts with `event: events.truncated` (data `{{"after", "oldest",
"pruned_through"}}`: events up to `pruned_through` are gone) and goes on from the oldest event
kept. `types` filters (comma-separated types, `sandbox.*`-style prefixes). Lines starting
with `:` are keep-alives. A team may hold a bounded number of streams open per server (429
`rate_limited` past it)."""


def _resume_point(raw: str | None, what: str) -> int | None:
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise ApiError(422, "validation_error", f"{what} must be an event id") from None
    if value < 0:
        raise ApiError(422, "validation_error", f"{what} must be >= 0")
    return value


def parse_types(raw: str | None) -> list[str] | None:
    if raw is None or raw.strip() == "":
        return None
    patterns = [p.strip() for p in raw.split(",") if p.strip()]
    bad = [p for p in patterns if not valid_pattern(p)]
    if bad:
        raise ApiError(422, "validation_error", f"unknown event types: {', '.join(bad)}")
    return patterns


@router.get("/events", operation_id="streamEvents",
            summary="The team's events (Server-Sent Events), resumable with Last-Event-ID",
            description=EVENTS_DESCRIPTION, responses=SSE_RESPONSES,
            response_class=StreamingResponse)
async def stream_events(
        who: CurrentPrincipal, service: Service, request: Request,
        types: Annotated[str | None, Query(max_length=1024, description=(
            "comma-separated event types or prefixes (sandbox.*); default: all"))] = None,
        since: Annotated[str | None, Query(max_length=20, description=(
            "resume after this event id"))] = None,
        team: Annotated[str | None, Query(max_length=128, description=(
            "admin keys: another team's events"))] = None,
        last_event_id: Annotated[str | None, Header(max_length=20)] = None,
) -> StreamingResponse:
    patterns = parse_types(types)
    cursor = _resume_point(last_event_id, "Last-Event-ID")
    if cursor is None:
        cursor = _resume_point(since, "since")
    if team is not None and team != who.team:
        if not who.admin:
            raise ApiError(403, "forbidden", "only an admin key reads another team's events")
        if not TEAM_RE.match(team):
            raise ApiError(422, "validation_error",
                           "team: letters, digits, '.', '_' and '-' only")
    scope = team or who.team
    slots: StreamSlots | None = getattr(request.app.state, "event_streams", None)
    if slots is None:
        slots = request.app.state.event_streams = StreamSlots(
            service.settings.max_event_streams_per_team)
    release = slots.take(scope)  # refused here (429), before the 200 is sent
    return event_stream(Frames(stream(EventLog(service.store), scope, cursor, patterns,
                                      global_ids=who.admin), release))


class Frames:
    """The stream's frames, giving the team's slot back when it ends, or when it is dropped
    without ever being read (a client gone before the response started)."""

    def __init__(self, inner: AsyncIterator[bytes], release: Callable[[], None]) -> None:
        self._inner = inner
        self._release: Callable[[], None] | None = release

    def _done(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()

    def __aiter__(self) -> Frames:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await anext(self._inner)
        except BaseException:
            self._done()
            with contextlib.suppress(Exception):
                await self._inner.aclose()  # type: ignore[attr-defined]
            raise

    def __del__(self) -> None:
        self._done()
