"""The webhook delivery worker over a real store (SQLite and PostgreSQL) and a real receiver on
127.0.0.1, with its clock and resolver injected: signed POSTs that verify, retries with
exponential backoff until the retry window ends, no redirects followed, the queue resumed
by a restarted worker, and the SSRF checks (at create and at each delivery, against DNS
rebinding)."""

from __future__ import annotations

import ipaddress
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pandastack.server.events.webhooks import WebhookService, backoff
from pandastack.server.events.webhooks_ssrf import TargetRefused, check_target, own_addresses
from pandastack.server.store import Store, open_store
from pandastack.server.store.events_log import EventLog
from pandastack.server.web.errors import ApiError
from pandastack.webhooks import InvalidSignature, verify_signature
from pandastack.wire.events import WebhookCreate
from tests.server.conftest import make_settings
from tests.server.webhook_receiver import Receiver, receiver

TEAM = "t1"


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def hook_receiver() -> Iterator[Receiver]:
    with receiver() as r:
        yield r


def service(store: Store, tmp: Path, clock: Clock, **settings: object) -> WebhookService:
    return WebhookService(EventLog(store, settle_seconds=0),
                          make_settings(tmp, webhook_allow_private=True, **settings),
                          clock=clock)


def test_backoff_doubles_up_to_an_hour() -> None:
    assert [backoff(n) for n in (1, 2, 3, 4)] == [30, 60, 120, 240]
    assert backoff(20) == 3600


async def test_delivery_signed_retried_and_resumed(store: Store, db: str, tmp_path: Path,
                                                   hook_receiver: Receiver) -> None:
    clock = Clock()
    svc = service(store, tmp_path, clock)
    try:
        hook, secret = await svc.create(TEAM, WebhookCreate(url=hook_receiver.url,
                                                            events=["sandbox.killed"]))
        event_id = svc.events.record(TEAM, "sandbox.killed", sandbox_id="sbx-000000000001",
                                     reason="killed via the API")
        svc.events.record(TEAM, "sandbox.created", sandbox_id="sbx-000000000001")  # filtered
        hook_receiver.statuses[:] = [500, 503]
        assert await svc.tick() == 1
        assert await svc.tick() == 0  # not due before its backoff
        [row] = svc.events.deliveries(hook.id)
        assert (row.status, row.attempts, row.response_status) == ("pending", 1, 500)
        assert row.next_attempt_at == pytest.approx(clock.now + 30)
    finally:
        await svc.aclose()

    # A restarted server's worker resumes the queue from the store.
    clock.now += 31
    store2 = open_store(db)
    svc2 = service(store2, tmp_path, clock)
    try:
        assert await svc2.tick() == 1
        [row] = svc2.events.deliveries(hook.id)
        assert (row.status, row.attempts, row.response_status) == ("pending", 2, 503)
        assert row.next_attempt_at == pytest.approx(clock.now + 60)
        clock.now += 61
        assert await svc2.tick() == 1
        [row] = svc2.events.deliveries(hook.id)
        assert (row.status, row.attempts, row.response_status) == ("delivered", 3, 204)
    finally:
        await svc2.aclose()
        store2.close()

    got = hook_receiver.wait_for(3)
    assert len(got) == 3 and all(r.path == "/hook" for r in got)
    for r in got:
        event = verify_signature(secret, r.headers, r.body, now=float(
            r.headers["X-Pandastack-Signature"].split(",")[0][2:]))
        assert (event["id"], event["type"], event["team"]) == (event_id, "sandbox.killed",
                                                               TEAM)
        assert r.headers["X-Pandastack-Event"] == "sandbox.killed"
    with pytest.raises(InvalidSignature):
        verify_signature("whsec_other", got[0].headers, got[0].body, tolerance_seconds=1e12)
    with pytest.raises(InvalidSignature):
        verify_signature(secret, got[0].headers, got[0].body + b" ", tolerance_seconds=1e12)
    with pytest.raises(InvalidSignature, match="off"):  # replayed long after
        verify_signature(secret, got[0].headers, got[0].body, now=time.time() + 3600)


async def test_retry_window_ends_and_redirects_are_answers(store: Store, tmp_path: Path) -> None:
    clock = Clock()
    with receiver(redirect_to="http://127.0.0.1:9/elsewhere") as r:
        svc = service(store, tmp_path, clock, webhook_retry_seconds=80.0)
        try:
            hook, _ = await svc.create(TEAM, WebhookCreate(url=r.url, events=["*"]))
            svc.events.record(TEAM, "quota.exceeded", limit="max_sandboxes")
            r.statuses[:] = [302] * 10
            assert await svc.tick() == 1
            clock.now += 31
            assert await svc.tick() == 1  # the next backoff (60 s) would pass the window
            [row] = svc.events.deliveries(hook.id)
            assert (row.status, row.attempts, row.response_status) == ("failed", 2, 302)
            assert row.finished_at is not None and row.next_attempt_at is None
            clock.now += 3600
            assert await svc.tick() == 0
            assert len(r.got) == 2  # the Location was never followed
            # A test delivery: one attempt, recorded.
            r.statuses[:] = []
            test = await svc.test(hook)
            assert (test.status, test.event_type, test.event_id) == ("delivered",
                                                                      "webhook.test", None)
            assert json.loads(r.got[-1].body)["webhook_id"] == hook.id
        finally:
            await svc.aclose()


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:8080/", "http://[::1]/", "http://169.254.169.254/latest/meta-data",
    "http://10.1.2.3/", "http://[::ffff:127.0.0.1]/", "http://100.64.0.1/",
    "http://224.0.0.1/", "http://0.0.0.0/", "http://[fd00:ec2::254]/",
    "http://localhost:8080/"])
async def test_private_targets_are_refused(url: str) -> None:
    with pytest.raises(TargetRefused):
        await check_target(url, allow_private=False, allow=())


#: IPv6 forms that carry an IPv4 address (public ones included: a translator decides where
#: they go) or reach site-local space; Python's table calls every one of them global.
CARRIERS = ["::8.8.8.8", "::127.0.0.1", "::ffff:0:8.8.8.8", "::ffff:0:127.0.0.1",
            "64:ff9b::8.8.8.8", "64:ff9b::7f00:1", "64:ff9b:1::808:808", "64:ff9b:1::a00:1",
            "fec0::1", "feff:ffff::1"]


@pytest.mark.parametrize("address", CARRIERS)
async def test_ipv6_forms_of_ipv4_and_site_local_are_refused(address: str) -> None:
    async def to_it(host: str, port: int) -> list[str]:
        return [address]

    with pytest.raises(TargetRefused):
        await check_target(f"http://[{address}]/", allow_private=False, allow=())
    with pytest.raises(TargetRefused):
        await check_target("http://hooks.example/", allow_private=False, allow=(),
                           resolve=to_it)
    # An operator's CIDR still opens exactly what it names.
    allowed = await check_target(f"http://[{address}]/", allow_private=False,
                                 allow=(ipaddress.ip_network(f"{address}/128"),))
    assert allowed.address == str(ipaddress.ip_address(address))


async def test_names_are_resolved_and_checked(store: Store, tmp_path: Path) -> None:
    async def to_loopback(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]

    async def mixed(host: str, port: int) -> list[str]:
        return ["93.184.216.34", "10.0.0.1"]

    # Refused, without a word of what the name resolved to or which rule it met.
    refusals = []
    for resolve in (to_loopback, mixed):
        with pytest.raises(TargetRefused) as refused:
            await check_target("http://hooks.example/", allow_private=False, allow=(),
                               resolve=resolve)
        refusals.append(str(refused.value))
    own = next((a for a in own_addresses() if not a.is_loopback), ipaddress.ip_address("::1"))

    async def to_own(host: str, port: int) -> list[str]:
        return [str(own)]

    with pytest.raises(TargetRefused) as refused:
        await check_target("http://hooks.example/", allow_private=False, allow=(),
                           resolve=to_own)
    refusals.append(str(refused.value))
    assert refusals[0] == refusals[1] == refusals[2]
    assert refusals[0].startswith("hooks.example ")
    for leak in ("127.0.0.1", "10.0.0.1", "93.184.216.34", str(own), "is an address of"):
        assert leak not in refusals[0]
    target = await check_target("http://hooks.example:81/x?y=1", allow_private=False,
                                allow=(ipaddress.ip_network("127.0.0.0/8"),),
                                resolve=to_loopback)
    assert (target.address, target.port, target.path) == ("127.0.0.1", 81, "/x?y=1")
    for bad in ("ftp://x/", "http://user:pw@hooks.example/", "http:///nohost"):
        with pytest.raises(TargetRefused):
            await check_target(bad, allow_private=False, allow=())


async def test_rebinding_is_refused_at_delivery(store: Store, tmp_path: Path,
                                                hook_receiver: Receiver) -> None:
    """Public when the webhook is made, loopback when it is delivered: nothing is sent."""
    answers = [["93.184.216.34"]]

    async def rebinding(host: str, port: int) -> list[str]:
        return answers[0]

    clock = Clock()
    settings = make_settings(tmp_path)
    svc = WebhookService(EventLog(store, settle_seconds=0), settings, clock=clock,
                         resolve=rebinding)
    try:
        port = int(hook_receiver.url.rsplit(":", 1)[1].split("/")[0])
        hook, _ = await svc.create(TEAM, WebhookCreate(url=f"http://hooks.example:{port}/hook",
                                                       events=["*"]))
        answers[0] = ["127.0.0.1"]
        svc.events.record(TEAM, "sandbox.killed", sandbox_id="sbx-000000000001")
        assert await svc.tick() == 1
        [row] = svc.events.deliveries(hook.id)
        assert row.status == "pending" and row.error is not None
        assert row.error.startswith("refused:") and "127.0.0.1" not in row.error
        assert hook_receiver.got == []
        with pytest.raises(ApiError) as refused:
            await svc.create(TEAM, WebhookCreate(url=hook_receiver.url, events=["*"]))
        assert refused.value.status == 422
        with pytest.raises(ApiError):
            await svc.create(TEAM, WebhookCreate(url="http://hooks.example/",
                                                 events=["sandbox.nope"]))
    finally:
        await svc.aclose()
