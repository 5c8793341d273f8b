"""Wire types of the event log and webhooks (`GET /v1/events`, `/v1/webhooks`), shared by the
server and the SDK. Times are UNIX seconds."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from pandastack.wire.base import Strict

#: Every event type the server writes, in the order the ADR describes them.
EVENT_TYPES: tuple[str, ...] = (
    "sandbox.created", "sandbox.paused", "sandbox.resumed", "sandbox.hibernated",
    "sandbox.woken", "sandbox.forked", "sandbox.snapshotted", "sandbox.killed",
    "sandbox.expired", "sandbox.reaped", "sandbox.failed", "sandbox.host_lost",
    "sandbox.stopped", "template.build.started", "template.build.succeeded",
    "template.build.failed", "quota.exceeded",
)
#: The event a webhook's test sends (never in the log).
TEST_EVENT = "webhook.test"
#: The stream's notice that the resume point was pruned (never in the log).
TRUNCATED_EVENT = "events.truncated"
SIGNATURE_HEADER = "X-Pandastack-Signature"
MAX_WEBHOOKS_PER_TEAM = 20

DeliveryStatus = Literal["pending", "delivered", "failed"]


def type_matches(pattern: str, event_type: str) -> bool:
    """`*` is every type, `sandbox.*` every type under `sandbox.`; else the exact type."""
    if pattern == "*":
        return True
    if pattern.endswith(".*"):
        return event_type.startswith(pattern[:-1])
    return pattern == event_type


def valid_pattern(pattern: str) -> bool:
    return any(type_matches(pattern, t) for t in EVENT_TYPES) and (
        pattern == "*" or pattern.endswith(".*") or pattern in EVENT_TYPES)


class Event(BaseModel):
    """One event. The fields every event has are named; the rest depend on the type
    (`reason`, `state`, `parent`, `children`, `snapshot_id`, `build_id`, `limit`, ...)."""

    model_config = ConfigDict(extra="allow")

    id: int = Field(description="the team's own event number; on an admin key's stream the "
                                "log's global id (the team's number is then in `seq`)")
    type: str
    time: float
    team: str
    actor: str = Field(description="the API key id behind it, or \"system\" (reaper, TTL, "
                                   "startup reconciliation)")
    sandbox_id: str | None = None
    template: str | None = None


class WebhookCreate(Strict):
    url: str = Field(min_length=1, max_length=2048, description="http(s) URL to POST to")
    events: list[str] = Field(min_length=1, max_length=len(EVENT_TYPES) + 8, description=(
        "event types, `sandbox.*`-style prefixes, or `*`"))
    description: str | None = Field(default=None, max_length=256)


class Webhook(Strict):
    id: str
    url: str
    events: list[str]
    description: str | None = None
    created_at: float


class WebhookCreated(Webhook):
    secret: str = Field(description="the signing secret: shown once, here")


class WebhookList(Strict):
    webhooks: list[Webhook]


class WebhookDelivery(Strict):
    id: int
    webhook_id: str
    event_id: int | None = Field(description="None for a test delivery")
    event_type: str
    status: DeliveryStatus
    attempts: int
    created_at: float
    next_attempt_at: float | None = None
    finished_at: float | None = None
    response_status: int | None = None
    error: str | None = None


class WebhookDeliveryList(Strict):
    deliveries: list[WebhookDelivery]

