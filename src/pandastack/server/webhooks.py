"""Webhooks: creating them (the target checked, a secret made), signing, and the delivery
worker the server's lifespan runs. The queue is in the store (`webhook_deliveries`): the
worker fans each new event out to the team's webhooks, then POSTs what is due, retrying
with exponential backoff until `webhook_retry_seconds` after the event; a restart resumes
from the store. Several servers on one database share the queue (claims skip each other's
rows)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx

from pandastack.webhooks import sign
from pandastack.wire_events import (
    MAX_WEBHOOKS_PER_TEAM,
    SIGNATURE_HEADER,
    TEST_EVENT,
    WebhookCreate,
    valid_pattern,
)

from .errors import ApiError
from .settings import Settings
from .store.events import Webhook, WebhookDelivery, actor
from .store.events_log import Claimed, EventLog
from .store.webhook_queue import claim_due_by_team
from .webhooks_dns import Resolver, TeamLookups
from .webhooks_ssrf import Target, TargetRefused, check_target, system_resolve

log = logging.getLogger("pandastack.server")

#: What the worker reads of a response (only the status counts).
MAX_RESPONSE_BYTES = 4096
#: A claimed delivery is retried after this if its worker never records the attempt.
CLAIM_LEASE_SECONDS = 120.0
CLAIM_BATCH = 16
USER_AGENT = "pandastack-webhooks/1"


def signature_header(secret: str, body: bytes, now: float) -> str:
    t = int(now)
    return f"t={t},v1={sign(secret, t, body)}"


def backoff(attempts: int) -> float:
    """Seconds before the next attempt after `attempts` failed ones: 30 s, doubling, at
    most an hour."""
    return float(min(30 * 2 ** max(0, attempts - 1), 3600))


@dataclass(frozen=True)
class Outcome:
    delivered: bool
    status: int | None
    error: str | None


def _netloc(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


class WebhookService:
    """The REST API's webhook operations and the delivery worker."""

    def __init__(self, log_: EventLog, settings: Settings, *,
                 clock: Callable[[], float] = time.time,
                 resolve: Resolver = system_resolve,
                 backoff_of: Callable[[int], float] = backoff,
                 transport: httpx.AsyncBaseTransport | None = None,
                 lookups: TeamLookups | None = None) -> None:
        self.events = log_
        self.settings = settings
        self.clock = clock
        self.lookups = lookups or TeamLookups(resolve)
        self.backoff_of = backoff_of
        self._allow = tuple(ipaddress.ip_network(c) for c in settings.webhook_allow_cidrs)
        # Redirects are never followed: a 3xx is an answer (not delivered), not a new target.
        self.client = httpx.AsyncClient(
            follow_redirects=False, transport=transport, trust_env=False,
            timeout=httpx.Timeout(settings.webhook_timeout_seconds),
            limits=httpx.Limits(max_connections=32, max_keepalive_connections=0))

    async def aclose(self) -> None:
        self.lookups.close()
        await self.client.aclose()

    async def target(self, url: str, team: str) -> Target:
        async def resolve(host: str, port: int) -> list[str]:
            return await self.lookups(team, host, port)
        return await check_target(url, allow_private=self.settings.webhook_allow_private,
                                  allow=self._allow, resolve=resolve)

    # -- the API -----------------------------------------------------------------------

    async def create(self, team: str, body: WebhookCreate) -> tuple[Webhook, str]:
        bad = [p for p in body.events if not valid_pattern(p)]
        if bad:
            raise ApiError(422, "validation_error", f"unknown event types: {', '.join(bad)} "
                           "(give types such as sandbox.created, a prefix such as "
                           "sandbox.*, or *)")
        try:
            await self.target(body.url, team)
        except TargetRefused as exc:
            raise ApiError(422, "validation_error", f"url refused: {exc}") from None
        secret = "whsec_" + secrets.token_urlsafe(32)
        row = Webhook(id="wh_" + secrets.token_hex(8), team=team, url=body.url,
                      events=list(dict.fromkeys(body.events)), description=body.description,
                      secret=secret, created_at=self.clock())
        if not await asyncio.to_thread(self.events.add_webhook, row, MAX_WEBHOOKS_PER_TEAM):
            raise ApiError(409, "conflict", f"team {team!r} has {MAX_WEBHOOKS_PER_TEAM} "
                           "webhooks already: delete one first")
        return row, secret

    async def test(self, hook: Webhook) -> WebhookDelivery:
        """POST a `webhook.test` event now, once (no retries); recorded in its log."""
        now = self.clock()
        body = json.dumps({"id": 0, "type": TEST_EVENT, "time": now, "team": hook.team,
                           "actor": actor(), "sandbox_id": None, "template": None,
                           "webhook_id": hook.id}, separators=(",", ":"))
        outcome = await self.post(hook.team, hook.url, hook.secret, body, TEST_EVENT, 0)
        row = WebhookDelivery(webhook_id=hook.id, team=hook.team, event_id=None,
                              event_type=TEST_EVENT, body=body,
                              status="delivered" if outcome.delivered else "failed",
                              attempts=1, created_at=now, next_attempt_at=None,
                              finished_at=self.clock(), response_status=outcome.status,
                              error=outcome.error)
        return await asyncio.to_thread(self.events.add_delivery, row)

    # -- delivering ----------------------------------------------------------------------

    async def post(self, team: str, url: str, secret: str, body: str, event_type: str,
                   delivery_id: int) -> Outcome:
        """One attempt: the target checked again (DNS may have changed), then a POST to the
        address checked. 2xx is delivered; anything else is an error to retry."""
        try:
            target = await self.target(url, team)
        except TargetRefused as exc:
            return Outcome(False, None, f"refused: {exc}")
        data = body.encode()
        default = 443 if target.scheme == "https" else 80
        host = target.host if ":" not in target.host else f"[{target.host}]"
        headers = {"Host": host if target.port == default else f"{host}:{target.port}",
                   "Content-Type": "application/json", "User-Agent": USER_AGENT,
                   "X-Pandastack-Event": event_type,
                   "X-Pandastack-Delivery": str(delivery_id),
                   SIGNATURE_HEADER: signature_header(secret, data, self.clock())}
        extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
        address = f"{target.scheme}://{_netloc(target.address, target.port)}{target.path}"
        try:
            request = self.client.build_request("POST", address, content=data,
                                                headers=headers, extensions=extensions)
            response = await self.client.send(request, stream=True)
            try:
                read = 0
                async for chunk in response.aiter_raw():
                    read += len(chunk)
                    if read >= MAX_RESPONSE_BYTES:
                        break
            finally:
                await response.aclose()
        except httpx.HTTPError as exc:
            return Outcome(False, None, f"{type(exc).__name__}: {exc}"[:500])
        ok = 200 <= response.status_code < 300
        return Outcome(ok, response.status_code,
                       None if ok else f"answered HTTP {response.status_code}")

    async def deliver(self, team: str, claimed: Claimed) -> None:
        outcome = await self.post(team, claimed.url, claimed.secret, claimed.body,
                                  claimed.event_type, claimed.id)
        now = self.clock()
        retry_at: float | None = None
        if not outcome.delivered:
            retry_at = now + self.backoff_of(claimed.attempts)
            if retry_at > claimed.created_at + self.settings.webhook_retry_seconds:
                retry_at = None
        await asyncio.to_thread(self.events.finish_attempt, claimed.id, now=now,
                                delivered=outcome.delivered, response_status=outcome.status,
                                error=outcome.error, retry_at=retry_at)

    async def tick(self) -> int:
        """Fan new events out, then attempt what is due; returns the attempts made."""
        now = self.clock()
        await asyncio.to_thread(self.events.fan_out, now)
        claimed = await asyncio.to_thread(claim_due_by_team, self.events.store, now,
                                          room=CLAIM_BATCH, per_team=CLAIM_BATCH, running={},
                                          lease_seconds=CLAIM_LEASE_SECONDS)
        if claimed:
            await asyncio.gather(*(self.deliver(team, c) for team, c in claimed))
        return len(claimed)

    async def run(self, interval: float = 1.0) -> None:
        """Runs until cancelled; a failing pass is logged and the next one tries again.
        A full batch goes straight on to the next one."""
        while True:
            try:
                made = await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("webhook delivery pass failed")
                made = 0
            if made < CLAIM_BATCH:
                await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def running(service: WebhookService,
                  interval: float = 1.0) -> AsyncIterator[WebhookService]:
    """The worker as a task for the server's lifespan; the client is closed after it."""
    task = asyncio.create_task(service.run(interval), name="pandastack-webhooks")
    try:
        yield service
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await service.aclose()
