"""Webhooks: creating them (the target checked, a secret made), signing, and the delivery
worker the server's lifespan runs. The queue is in the store (`webhook_deliveries`): the
worker fans each new event out to the team's webhooks, then POSTs what is due, retrying
with exponential backoff until `webhook_retry_seconds` after the event; a restart resumes
from the store. Several servers on one database share the queue (claims skip each other's
rows).

One tenant must not stall another (issue 33): each attempt, name lookup included, has one
deadline for all of it (`webhook_timeout_seconds`), not a timeout per read that a receiver
trickling a byte at a time resets forever; each team's deliveries run in a lane of their
own, at most `ATTEMPTS_PER_TEAM` at once, and the worker never waits for a pass to finish
before claiming more for the other teams."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx

from pandastack.webhooks import sign
from pandastack.wire.events import (
    MAX_WEBHOOKS_PER_TEAM,
    SIGNATURE_HEADER,
    TEST_EVENT,
    WebhookCreate,
    valid_pattern,
)

from ..accounts.team_slots import TeamSlots
from ..settings import Settings
from ..store.events import Webhook, WebhookDelivery, actor
from ..store.events_log import Claimed, EventLog
from ..store.webhook_queue import claim_due_by_team
from ..web.errors import ApiError
from .webhooks_dns import Resolver, TeamLookups
from .webhooks_ssrf import Target, TargetRefused, check_target, system_resolve

log = logging.getLogger("pandastack.server")

#: What the worker reads of a response (only the status counts).
MAX_RESPONSE_BYTES = 4096
#: A claimed delivery is retried after this if its worker never records the attempt.
CLAIM_LEASE_SECONDS = 120.0
#: Attempts one team's webhooks may have in flight on this server, and all teams'.
ATTEMPTS_PER_TEAM = 4
ATTEMPTS_IN_ALL = 64
#: `POST /v1/webhooks/{id}/test` calls one team may have waiting on receivers at once.
TESTS_PER_TEAM = 2
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
        self.deadline = settings.webhook_timeout_seconds
        self.test_slots = TeamSlots(TESTS_PER_TEAM, "webhook tests waiting on receivers")
        #: Each team's attempts in flight on this server (its lane).
        self.lanes: dict[str, set[asyncio.Task[None]]] = {}
        # Redirects are never followed: a 3xx is an answer (not delivered), not a new target.
        # No pool limit: the lanes and the test slots bound the connections, and a pool
        # limit would make one team's slow receivers keep the others' requests waiting.
        self.client = httpx.AsyncClient(
            follow_redirects=False, transport=transport, trust_env=False,
            timeout=httpx.Timeout(self.deadline),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=0))

    async def aclose(self) -> None:
        """Attempts still in flight are dropped: their claims' leases bring them back."""
        running = [t for lane in self.lanes.values() for t in lane]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
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
        """POST a `webhook.test` event now, once (no retries); recorded in its log. Bounded
        as a delivery is (one deadline), and at most `TESTS_PER_TEAM` at once per team
        (429 past that), so a slow receiver cannot pile up a team's requests."""
        now = self.clock()
        body = json.dumps({"id": 0, "type": TEST_EVENT, "time": now, "team": hook.team,
                           "actor": actor(), "sandbox_id": None, "template": None,
                           "webhook_id": hook.id}, separators=(",", ":"))
        with self.test_slots.take(hook.team):
            seq = await asyncio.to_thread(self.events.delivery_number, hook.team)
            outcome = await self.post(hook.team, hook.url, hook.secret, body, TEST_EVENT, seq)
        row = WebhookDelivery(seq=seq, webhook_id=hook.id, team=hook.team, event_id=None,
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
        address checked, all of it within `deadline`. 2xx is delivered; anything else is an
        error to retry."""
        try:
            async with asyncio.timeout(self.deadline):
                return await self._post(team, url, secret, body, event_type, delivery_id)
        except TimeoutError:
            return Outcome(False, None, f"no answer within the attempt's deadline "
                           f"({self.deadline:g} s)")

    async def _post(self, team: str, url: str, secret: str, body: str, event_type: str,
                    delivery_id: int) -> Outcome:
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
                                  claimed.event_type, claimed.seq)
        now = self.clock()
        retry_at: float | None = None
        if not outcome.delivered:
            retry_at = now + self.backoff_of(claimed.attempts)
            if retry_at > claimed.created_at + self.settings.webhook_retry_seconds:
                retry_at = None
        await asyncio.to_thread(self.events.finish_attempt, claimed.id, now=now,
                                delivered=outcome.delivered, response_status=outcome.status,
                                error=outcome.error, retry_at=retry_at)

    def in_flight(self) -> list[asyncio.Task[None]]:
        return [t for lane in self.lanes.values() for t in lane]

    async def start_due(self) -> int:
        """Fan new events out, then start the attempts that are due and have room in their
        team's lane; returns how many started (they run on: `settle` waits for them)."""
        now = self.clock()
        await asyncio.to_thread(self.events.fan_out, now)
        running = {team: len(lane) for team, lane in self.lanes.items()}
        claimed = await asyncio.to_thread(
            claim_due_by_team, self.events.store, now,
            room=ATTEMPTS_IN_ALL - sum(running.values()), per_team=ATTEMPTS_PER_TEAM,
            running=running, lease_seconds=max(CLAIM_LEASE_SECONDS, 2 * self.deadline))
        for team, c in claimed:
            lane = self.lanes.setdefault(team, set())
            task = asyncio.create_task(self.deliver(team, c),
                                       name=f"pandastack-webhook-{c.id}")
            lane.add(task)
            task.add_done_callback(functools.partial(self._ended, team))
        return len(claimed)

    def _ended(self, team: str, task: asyncio.Task[None]) -> None:
        lane = self.lanes.get(team)
        if lane is not None:
            lane.discard(task)
            if not lane:
                del self.lanes[team]
        if not task.cancelled() and task.exception() is not None:
            # The attempt was made; recording it failed. Its lease brings it back.
            log.error("webhook delivery failed to record", exc_info=task.exception())

    async def settle(self) -> None:
        """Wait until no attempt is in flight."""
        while running := self.in_flight():
            await asyncio.wait(running)

    async def tick(self) -> int:
        """One pass, waited for: fan out, attempt what is due (as far as the lanes have
        room), and return when those attempts are recorded; returns how many were made."""
        made = await self.start_due()
        await self.settle()
        return made

    async def run(self, interval: float = 1.0) -> None:
        """Runs until cancelled; a failing pass is logged and the next one tries again.
        A pass never waits for its attempts: the next one comes after `interval`, or as soon
        as an attempt ends (its lane has room again)."""
        while True:
            try:
                await self.start_due()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("webhook delivery pass failed")
            running = self.in_flight()
            if running:
                await asyncio.wait(running, timeout=interval,
                                   return_when=asyncio.FIRST_COMPLETED)
            else:
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
