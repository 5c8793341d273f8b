"""`client.events.stream()`: the team's event log, live, and `client.webhooks`; sync and async.

    with client.events.stream(types=["sandbox.*"]) as events:
        for e in events:          # Event: id, type, time, team, actor, sandbox_id, ...
            print(e.id, e.type, e.sandbox_id)

The stream is open, and its start fixed, when `stream()` returns: events written after that
call are seen. A dropped connection is reopened from the last event seen (`Last-Event-ID`),
up to `reconnects` times in a row; pass `after=` (an event id, e.g. a `last_id` kept from an
earlier stream) to resume from there. If that point was pruned from the server's log,
`truncated` holds the server's notice and the stream goes on from the oldest event kept.
"""

from __future__ import annotations

import builtins
import contextlib
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import anyio
import httpx

from pandastack.sdk import _base
from pandastack.sdk._events import (
    EventDecoder,
    create_webhook_call,
    delete_webhook_call,
    deliveries_call,
    events_call,
    get_webhook_call,
    list_webhooks_call,
    test_webhook_call,
)
from pandastack.sdk._http import HTTP, AsyncHTTP
from pandastack.sdk.errors import APIConnectionError, ProtocolError, TransportTimeoutError
from pandastack.wire.events import Event, Webhook, WebhookCreated, WebhookDelivery

__all__ = ["AsyncEventStream", "AsyncEvents", "AsyncWebhooks", "Event", "EventStream",
           "Events", "Webhooks"]

#: Seconds between reconnects of a dropped stream.
RECONNECT_DELAY = 1.0
_DROPPED = (APIConnectionError, TransportTimeoutError, ProtocolError, httpx.HTTPError)


class _Resume:
    """What both twins keep across connections."""

    def __init__(self, types: Sequence[str] | str | None, after: int | None,
                 team: str | None, reconnects: int) -> None:
        self.types, self.team, self.reconnects = types, team, reconnects
        self.last_id: int | None = after
        self.truncated: dict[str, Any] | None = None
        self.stopped = False

    def call(self, timeout: httpx.Timeout) -> _base.Call[None]:
        return events_call(types=self.types, after=self.last_id, team=self.team,
                           base_timeout=timeout)

    def started(self, decoder: EventDecoder) -> None:
        if decoder.truncated is not None:
            self.truncated = decoder.truncated
        if self.last_id is None or (decoder.truncated is not None and decoder.after is not None):
            self.last_id = decoder.after


class EventStream:
    """The live event log: iterate it for `Event`s; `stop()` ends it (also leaving `with`).
    `last_id` is the id to resume from later."""

    def __init__(self, http: HTTP, types: Sequence[str] | str | None = None, *,
                 after: int | None = None, team: str | None = None,
                 reconnects: int = 5) -> None:
        self._http = http
        self._state = _Resume(types, after, team, reconnects)
        self._stack = contextlib.ExitStack()
        self._pending: list[Event] = []
        self._chunks: Iterator[bytes] | None = None
        self._decoder = EventDecoder()
        self._open()

    @property
    def last_id(self) -> int | None:
        """The id of the last event handed out (or where the stream started): pass it as
        `after=` to resume later."""
        return self._state.last_id

    @property
    def truncated(self) -> dict[str, Any] | None:
        """The server's notice that the resume point was pruned (`after`, `oldest`,
        `pruned_through`: events up to it are gone), or None."""
        return self._state.truncated

    def _open(self) -> None:
        self._stack.close()
        self._stack = contextlib.ExitStack()
        self._decoder = EventDecoder()
        call = self._state.call(self._http.timeout)
        try:
            response = self._stack.enter_context(self._http.stream(call))
            self._chunks = response.iter_bytes()
            with _base.transport_errors(call.label):
                for chunk in self._chunks:
                    self._pending += self._decoder.feed(chunk)
                    if self._decoder.ready:
                        self._state.started(self._decoder)
                        return
            raise ProtocolError("GET /v1/events: the stream ended before it was ready")
        except BaseException:
            self._stack.close()
            raise

    def __iter__(self) -> Iterator[Event]:
        failures = 0
        while not self._state.stopped:
            yield from self._take()
            try:
                assert self._chunks is not None
                with _base.transport_errors("GET /v1/events"):
                    chunk = next(self._chunks, None)
                if chunk is None:
                    raise ProtocolError("GET /v1/events: the server ended the stream")
                self._pending += self._decoder.feed(chunk)
                failures = 0
            except _DROPPED:
                if self._state.stopped:
                    return
                failures += 1
                if failures > self._state.reconnects:
                    raise
                time.sleep(RECONNECT_DELAY)
                with contextlib.suppress(*_DROPPED):
                    self._open()

    def _take(self) -> list[Event]:
        out, self._pending = self._pending, []
        if out:
            self._state.last_id = out[-1].id
        return out

    def stop(self) -> None:
        """End the stream (iteration ends)."""
        self._state.stopped = True
        with contextlib.suppress(httpx.HTTPError, OSError, RuntimeError):
            self._stack.close()

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class AsyncEventStream:
    """The live event log, async: `async for` it; `await stop()` ends it."""

    def __init__(self, http: AsyncHTTP, types: Sequence[str] | str | None = None, *,
                 after: int | None = None, team: str | None = None,
                 reconnects: int = 5) -> None:
        self._http = http
        self._state = _Resume(types, after, team, reconnects)
        self._stack = contextlib.AsyncExitStack()
        self._pending: list[Event] = []
        self._chunks: AsyncIterator[bytes] | None = None
        self._decoder = EventDecoder()

    @property
    def last_id(self) -> int | None:
        """The id of the last event handed out (or where the stream started): pass it as
        `after=` to resume later."""
        return self._state.last_id

    @property
    def truncated(self) -> dict[str, Any] | None:
        """The server's notice that the resume point was pruned (`after`, `oldest`,
        `pruned_through`: events up to it are gone), or None."""
        return self._state.truncated

    async def _open(self) -> None:
        await self._stack.aclose()
        self._stack = contextlib.AsyncExitStack()
        self._decoder = EventDecoder()
        call = self._state.call(self._http.timeout)
        try:
            response = await self._stack.enter_async_context(self._http.stream(call))
            self._chunks = response.aiter_bytes()
            with _base.transport_errors(call.label):
                async for chunk in self._chunks:
                    self._pending += self._decoder.feed(chunk)
                    if self._decoder.ready:
                        self._state.started(self._decoder)
                        return
            raise ProtocolError("GET /v1/events: the stream ended before it was ready")
        except BaseException:
            await self._stack.aclose()
            raise

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        failures = 0
        while not self._state.stopped:
            for e in self._take():
                yield e
            try:
                assert self._chunks is not None, "opened by AsyncEvents.stream()"
                with _base.transport_errors("GET /v1/events"):
                    chunk = await anext(self._chunks, None)
                if chunk is None:
                    raise ProtocolError("GET /v1/events: the server ended the stream")
                self._pending += self._decoder.feed(chunk)
                failures = 0
            except _DROPPED:
                if self._state.stopped:
                    return
                failures += 1
                if failures > self._state.reconnects:
                    raise
                await anyio.sleep(RECONNECT_DELAY)
                with contextlib.suppress(*_DROPPED):
                    await self._open()

    def _take(self) -> list[Event]:
        out, self._pending = self._pending, []
        if out:
            self._state.last_id = out[-1].id
        return out

    async def stop(self) -> None:
        """End the stream (iteration ends)."""
        self._state.stopped = True
        with contextlib.suppress(httpx.HTTPError, OSError, RuntimeError):
            await self._stack.aclose()

    async def __aenter__(self) -> AsyncEventStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


class Events(_base.ClientBase[HTTP]):
    """`client.events`: the team's event log."""

    def stream(self, types: Sequence[str] | str | None = None, *, after: int | None = None,
               team: str | None = None, reconnects: int = 5) -> EventStream:
        """Open the live stream (filtered by `types`: types or `sandbox.*`-style prefixes),
        from now or after event id `after`; `team`: another team's (admin keys)."""
        return EventStream(self._http, types, after=after, team=team, reconnects=reconnects)


class AsyncEvents(_base.ClientBase[AsyncHTTP]):
    """`client.events`: the team's event log (async)."""

    async def stream(self, types: Sequence[str] | str | None = None, *,
                     after: int | None = None, team: str | None = None,
                     reconnects: int = 5) -> AsyncEventStream:
        """Open the live stream (as `Events.stream`); it is ready when this returns."""
        stream = AsyncEventStream(self._http, types, after=after, team=team,
                                  reconnects=reconnects)
        await stream._open()
        return stream


class Webhooks(_base.ClientBase[HTTP]):
    """`client.webhooks`: the team's webhooks (verify what they send with
    `pandastack.webhooks.verify_signature`)."""

    def create(self, url: str, events: Sequence[str], *,
               description: str | None = None) -> WebhookCreated:
        """A webhook POSTing these event types to `url`; `.secret` is shown only this once."""
        return self._http.run(create_webhook_call(url, events, description))

    def list(self) -> builtins.list[Webhook]:
        """The team's webhooks (without secrets)."""
        return self._http.run(list_webhooks_call())

    def get(self, webhook_id: str) -> Webhook:
        """Webhook `webhook_id` (`NotFoundError` if the team has none of that id)."""
        return self._http.run(get_webhook_call(webhook_id))

    def delete(self, webhook_id: str) -> None:
        """Delete the webhook with its pending deliveries and its log."""
        self._http.run(delete_webhook_call(webhook_id))

    def test(self, webhook_id: str) -> WebhookDelivery:
        """POST a `webhook.test` event now, once; the delivery as recorded."""
        return self._http.run(test_webhook_call(webhook_id))

    def deliveries(self, webhook_id: str, *, limit: int | None = None,
                   before: int | None = None) -> builtins.list[WebhookDelivery]:
        """The webhook's deliveries, newest first (`before`: ids below it, the next page).
        Ids are the team's own delivery numbers, as `X-Pandastack-Delivery` tells them."""
        return self._http.run(deliveries_call(webhook_id, limit, before))


class AsyncWebhooks(_base.ClientBase[AsyncHTTP]):
    """`client.webhooks`: the team's webhooks (async)."""

    async def create(self, url: str, events: Sequence[str], *,
                     description: str | None = None) -> WebhookCreated:
        """A webhook POSTing these event types to `url`; `.secret` is shown only this once."""
        return await self._http.run(create_webhook_call(url, events, description))

    async def list(self) -> builtins.list[Webhook]:
        """The team's webhooks (without secrets)."""
        return await self._http.run(list_webhooks_call())

    async def get(self, webhook_id: str) -> Webhook:
        """Webhook `webhook_id` (`NotFoundError` if the team has none of that id)."""
        return await self._http.run(get_webhook_call(webhook_id))

    async def delete(self, webhook_id: str) -> None:
        """Delete the webhook with its pending deliveries and its log."""
        await self._http.run(delete_webhook_call(webhook_id))

    async def test(self, webhook_id: str) -> WebhookDelivery:
        """POST a `webhook.test` event now, once; the delivery as recorded."""
        return await self._http.run(test_webhook_call(webhook_id))

    async def deliveries(self, webhook_id: str, *, limit: int | None = None,
                         before: int | None = None) -> builtins.list[WebhookDelivery]:
        """The webhook's deliveries, newest first (`before`: ids below it, the next page).
        Ids are the team's own delivery numbers, as `X-Pandastack-Delivery` tells them."""
        return await self._http.run(deliveries_call(webhook_id, limit, before))
