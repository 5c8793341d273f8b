"""Call builders and the stream decoder of the event log (`GET /v1/events`, Server-Sent
Events) and of webhooks (`/v1/webhooks`). No I/O: `sdk/events.py` runs them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import httpx
import pydantic

from pandastack.sdk._base import (
    Call,
    encode,
    ignore_body,
    model_decoder,
    path_segment,
    with_read_timeout,
)
from pandastack.sdk._sse import SSEDecoder
from pandastack.sdk.errors import InvalidRequestError, ProtocolError
from pandastack.wire.events import (
    TRUNCATED_EVENT,
    Event,
    Webhook,
    WebhookCreate,
    WebhookCreated,
    WebhookDelivery,
    WebhookDeliveryList,
    WebhookList,
    valid_pattern,
)

__all__ = ["EventDecoder", "events_call"]


def _types(types: Sequence[str] | str | None) -> str | None:
    if types is None:
        return None
    items = [types] if isinstance(types, str) else list(types)
    bad = [t for t in items if not valid_pattern(t)]
    if bad:
        raise InvalidRequestError(f"unknown event types: {', '.join(bad)}", status=422,
                                  code="validation_error")
    return ",".join(items)


def events_call(*, types: Sequence[str] | str | None, after: int | None, team: str | None,
                base_timeout: httpx.Timeout) -> Call[None]:
    params = {k: v for k, v in (("types", _types(types)), ("team", team)) if v is not None}
    headers = {"Accept": "text/event-stream"}
    if after is not None:
        headers["Last-Event-ID"] = str(int(after))
    # No read timeout: a quiet team's stream sends only keep-alives.
    return Call("GET", "/v1/events", ignore_body, params=params, headers=headers,
                timeout=with_read_timeout(base_timeout, None))


class EventDecoder:
    """Turns the stream into `Event`s; `ready` once the server said where it starts
    (`after`), `truncated` the server's notice that the resume point was pruned."""

    def __init__(self) -> None:
        self._sse = SSEDecoder()
        self.ready = False
        self.after: int | None = None
        self.truncated: dict[str, Any] | None = None

    def feed(self, chunk: bytes) -> list[Event]:
        return self._handle(self._sse.feed(chunk))

    def close(self) -> list[Event]:
        return self._handle(self._sse.close())

    def _handle(self, items: Sequence[Any]) -> list[Event]:
        out: list[Event] = []
        for item in items:
            if item.event == "ready":
                self.ready = True
                self.after = int(json.loads(item.data).get("after") or 0)
            elif item.event == TRUNCATED_EVENT:
                self.truncated = json.loads(item.data)
            elif item.id is not None:
                try:  # extra fields are the type's own: kept, not pruned
                    out.append(Event.model_validate_json(item.data))
                except pydantic.ValidationError as exc:
                    raise ProtocolError(f"/v1/events: not a valid event: {exc}") from exc
        return out


# -- webhooks ------------------------------------------------------------------------------

def _hook(webhook_id: str, *rest: str) -> str:
    return "/".join(("/v1/webhooks", path_segment(webhook_id), *rest))


def create_webhook_call(url: str, events: Sequence[str], description: str | None
                        ) -> Call[WebhookCreated]:
    body = encode(WebhookCreate, url=url, events=list(events), description=description)
    return Call("POST", "/v1/webhooks", model_decoder(WebhookCreated), json=body)


def list_webhooks_call() -> Call[list[Webhook]]:
    decode = model_decoder(WebhookList)
    return Call("GET", "/v1/webhooks", lambda r: decode(r).webhooks)


def get_webhook_call(webhook_id: str) -> Call[Webhook]:
    return Call("GET", _hook(webhook_id), model_decoder(Webhook))


def delete_webhook_call(webhook_id: str) -> Call[None]:
    return Call("DELETE", _hook(webhook_id), ignore_body)


def test_webhook_call(webhook_id: str) -> Call[WebhookDelivery]:
    return Call("POST", _hook(webhook_id, "test"), model_decoder(WebhookDelivery))


def deliveries_call(webhook_id: str, limit: int | None,
                    before: int | None) -> Call[list[WebhookDelivery]]:
    params = {k: str(v) for k, v in (("limit", limit), ("before", before)) if v is not None}
    decode = model_decoder(WebhookDeliveryList)
    return Call("GET", _hook(webhook_id, "deliveries"), lambda r: decode(r).deliveries,
                params=params)
