"""Webhooks of the team: create (the secret is returned once), list, get, delete, test, and
the delivery log."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response

from pandastack.wire.events import (
    MAX_WEBHOOKS_PER_TEAM,
    SIGNATURE_HEADER,
    Webhook,
    WebhookCreate,
    WebhookCreated,
    WebhookDelivery,
    WebhookDeliveryList,
    WebhookList,
)

from ..accounts.auth import CurrentPrincipal
from ..events.webhooks import WebhookService
from ..store.events import Webhook as WebhookRow
from ..store.events import WebhookDelivery as DeliveryRow
from ..web.errors import not_found
from ..web.jsonbody import StrictJsonRoute
from .links import links

router = APIRouter(tags=["webhooks"], route_class=StrictJsonRoute)

WebhookId = Annotated[str, Path(max_length=64, description="webhook id, e.g. wh_0123456789abcdef")]

CREATE_DESCRIPTION = f"""POSTs each event of the given types (`sandbox.created`, a prefix such
as `sandbox.*`, or `*`) that happens from now on to `url` as JSON (the event, as
`GET /v1/events` sends it), signed: header `{SIGNATURE_HEADER}: t=<unix seconds>,v1=<hex>`,
`v1` the HMAC-SHA256 of `t + "." + body` under the secret this answer holds (shown once).
A delivery that does not get a 2xx is retried with exponential backoff (30 s, doubling, at
most an hour apart) for 24 h; redirects are not followed. The target's host must resolve
to public addresses only (not loopback, private, link-local, CGNAT, multicast, metadata or
this host's own) unless the operator allows them; it is checked again at every delivery. At
most {MAX_WEBHOOKS_PER_TEAM} webhooks per team (409)."""


def _service(request: Request) -> WebhookService:
    service: WebhookService = request.app.state.webhooks
    return service


def to_webhook(row: WebhookRow) -> Webhook:
    return Webhook(id=row.id, url=row.url, events=list(row.events),
                   description=row.description, created_at=row.created_at)


def to_delivery(row: DeliveryRow) -> WebhookDelivery:
    return WebhookDelivery(id=row.seq, webhook_id=row.webhook_id, event_id=row.event_id,
                           event_type=row.event_type, status=row.status,  # type: ignore[arg-type]
                           attempts=row.attempts, created_at=row.created_at,
                           next_attempt_at=row.next_attempt_at, finished_at=row.finished_at,
                           response_status=row.response_status, error=row.error)


async def _row(request: Request, team: str, webhook_id: str) -> WebhookRow:
    row = await asyncio.to_thread(_service(request).events.webhook, team, webhook_id)
    if row is None:
        raise not_found(f"webhook {webhook_id!r}")
    return row


@router.post("/webhooks", response_model=WebhookCreated, status_code=201,
             operation_id="createWebhook", summary="Create a webhook (its secret is shown once)",
             responses=links(201, ("getWebhook", "deleteWebhook", "testWebhook",
                                   "listWebhookDeliveries"),
                             {"webhook_id": "$response.body#/id"}),
             description=CREATE_DESCRIPTION)
async def create_webhook(body: WebhookCreate, who: CurrentPrincipal,
                         request: Request) -> WebhookCreated:
    row, secret = await _service(request).create(who.team, body)
    return WebhookCreated(**to_webhook(row).model_dump(), secret=secret)


@router.get("/webhooks", response_model=WebhookList, operation_id="listWebhooks",
            summary="The team's webhooks")
async def list_webhooks(who: CurrentPrincipal, request: Request) -> WebhookList:
    rows = await asyncio.to_thread(_service(request).events.webhooks, who.team)
    return WebhookList(webhooks=[to_webhook(r) for r in rows])


@router.get("/webhooks/{webhook_id}", response_model=Webhook, operation_id="getWebhook",
            summary="One of the team's webhooks")
async def get_webhook(webhook_id: WebhookId, who: CurrentPrincipal,
                      request: Request) -> Webhook:
    return to_webhook(await _row(request, who.team, webhook_id))


@router.delete("/webhooks/{webhook_id}", status_code=204, operation_id="deleteWebhook",
               summary="Delete a webhook, its pending deliveries and its delivery log")
async def delete_webhook(webhook_id: WebhookId, who: CurrentPrincipal,
                         request: Request) -> Response:
    if not await asyncio.to_thread(_service(request).events.delete_webhook, who.team,
                                   webhook_id):
        raise not_found(f"webhook {webhook_id!r}")
    return Response(status_code=204)


@router.post("/webhooks/{webhook_id}/test", response_model=WebhookDelivery,
             operation_id="testWebhook",
             summary="POST a webhook.test event to the webhook now, once (no retries); the "
                     "answer is the delivery as its log records it")
async def test_webhook(webhook_id: WebhookId, who: CurrentPrincipal,
                       request: Request) -> WebhookDelivery:
    row = await _row(request, who.team, webhook_id)
    return to_delivery(await _service(request).test(row))


@router.get("/webhooks/{webhook_id}/deliveries", response_model=WebhookDeliveryList,
            operation_id="listWebhookDeliveries",
            summary="The webhook's deliveries, newest first (pending ones with their next "
                    "attempt; finished ones are kept for the event retention window)")
async def list_deliveries(
        webhook_id: WebhookId, who: CurrentPrincipal, request: Request,
        limit: Annotated[int, Query(ge=1, le=500)] = 100,
        before: Annotated[int | None, Query(ge=1, description=(
            "deliveries with ids below this (the next page)"))] = None,
) -> WebhookDeliveryList:
    await _row(request, who.team, webhook_id)
    rows = await asyncio.to_thread(_service(request).events.deliveries, webhook_id, limit,
                                   before)
    return WebhookDeliveryList(deliveries=[to_delivery(r) for r in rows])
