"""One tenant's webhooks must not stall another's, nor the server (issue 33): an attempt has
one deadline however slowly its receiver trickles, each team's deliveries run in a lane of
their own with a bound, and name lookups that never answer neither take the threads the API
needs nor hold an attempt past its deadline. Real stores, real receivers on 127.0.0.1; the
system resolver is stood in for only for names under `.never.test`, which block."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pandastack.server.events.webhooks import (
    ATTEMPTS_PER_TEAM,
    TESTS_PER_TEAM,
    WebhookService,
    running,
)
from pandastack.server.store import Store, open_store
from pandastack.server.store.events_log import EventLog
from pandastack.server.web.errors import ApiError
from pandastack.wire.events import WebhookCreate
from tests.server.conftest import make_settings
from tests.server.webhook_receiver import receiver

WAIT = 60.0  # generous bound on waits for conditions (never a pass/fail threshold)


async def until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting for {what}")
        await asyncio.sleep(0.02)


async def test_a_trickling_receiver_meets_one_deadline(store: Store, tmp_path: Path) -> None:
    """A byte every 0.2 s never trips a 1 s per-read timeout; the attempt's deadline ends
    it (and a test POST) long before the receiver would have finished."""
    svc = WebhookService(EventLog(store, settle_seconds=0),
                         make_settings(tmp_path, webhook_allow_private=True,
                                       webhook_timeout_seconds=1.0))
    with receiver(trickle_for=WAIT) as r:
        try:
            hook, _ = await svc.create("t1", WebhookCreate(url=r.url, events=["*"]))
            svc.events.record("t1", "sandbox.killed", sandbox_id="sbx-000000000001")
            assert await svc.tick() == 1
            [row] = svc.events.deliveries(hook.id)
            assert row.status == "pending" and row.response_status is None
            assert row.error is not None and "deadline" in row.error
            assert r.answered == 0  # it ended before the receiver's answer did

            # The test route: the same deadline, and a bound per team on waiting ones.
            done = await asyncio.gather(*(svc.test(hook) for _ in range(TESTS_PER_TEAM + 1)),
                                        return_exceptions=True)
            refused = [d for d in done if isinstance(d, ApiError)]
            assert [e.status for e in refused] == [429]
            tests = [d for d in done if not isinstance(d, BaseException)]
            assert len(tests) == TESTS_PER_TEAM
            assert all(t.status == "failed" and "deadline" in (t.error or "") for t in tests)
            assert r.answered == 0
        finally:
            await svc.aclose()


async def test_each_team_has_its_own_bounded_lane(store: Store, tmp_path: Path) -> None:
    """Team A's six deliveries to a receiver that never finishes take at most
    ATTEMPTS_PER_TEAM places; team B's event, queued after them, is delivered while all of
    A's are still waiting on their receiver."""
    svc = WebhookService(EventLog(store, settle_seconds=0),
                         make_settings(tmp_path, webhook_allow_private=True,
                                       webhook_timeout_seconds=WAIT * 2))
    with receiver(trickle_for=WAIT) as slow, receiver() as fast:
        try:
            a_hooks = [(await svc.create("a", WebhookCreate(url=f"{slow.url}/{n}",
                                                            events=["*"])))[0]
                       for n in range(ATTEMPTS_PER_TEAM + 2)]
            b_hook, _ = await svc.create("b", WebhookCreate(url=fast.url, events=["*"]))
            async with running(svc, interval=0.05):
                svc.events.record("a", "sandbox.killed", sandbox_id="sbx-00000000000a")
                await until(lambda: len(slow.got) >= ATTEMPTS_PER_TEAM, "team A's attempts")
                svc.events.record("b", "sandbox.killed", sandbox_id="sbx-00000000000b")
                await until(lambda: len(fast.got) == 1, "team B's delivery")
                assert slow.answered == 0
                # A's lane stayed full, and no more of A's were started meanwhile.
                assert len(slow.got) == ATTEMPTS_PER_TEAM
                attempts = sorted(svc.events.deliveries(h.id)[0].attempts for h in a_hooks)
                assert attempts == [0] * 2 + [1] * ATTEMPTS_PER_TEAM
                await until(lambda: svc.events.deliveries(b_hook.id)[0].status == "delivered",
                            "team B's delivery recorded")
        finally:
            await svc.aclose()


class NeverAnswers:
    """socket.getaddrinfo for names under .never.test blocks until released (bounded, for
    a test that fails); every other name goes to the system resolver."""

    def __init__(self) -> None:
        self.real = socket.getaddrinfo
        self.released = threading.Event()
        self.entered = 0
        self.lock = threading.Lock()

    def __call__(self, host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith(".never.test"):
            with self.lock:
                self.entered += 1
            self.released.wait(WAIT * 2)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return self.real(host, *args, **kwargs)


async def test_lookups_that_never_answer_stall_no_one(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Twelve of team 1's targets whose DNS never answers: the API's threads stay free
    (another team's list is answered at once), each create is refused within the lookup
    deadline, team 1 holds at most its share of resolver threads, and team 2's own lookup
    still runs."""
    store = open_store(f"sqlite:///{tmp_path / 'dns.db'}")
    svc = WebhookService(EventLog(store, settle_seconds=0), make_settings(tmp_path))
    never = NeverAnswers()
    monkeypatch.setattr(socket, "getaddrinfo", never)
    try:
        creates = [asyncio.create_task(svc.create("t1", WebhookCreate(
            url=f"http://h{n}.never.test/", events=["*"]))) for n in range(12)]
        await until(lambda: never.entered >= 4 or all(c.done() for c in creates),
                    "lookups to block")
        # What GET /v1/webhooks does: a store query in the default executor.
        assert await asyncio.wait_for(asyncio.to_thread(svc.events.webhooks, "t2"),
                                      WAIT) == []
        with pytest.raises(ApiError) as other:
            await asyncio.wait_for(svc.create("t2", WebhookCreate(
                url="http://localhost:8080/", events=["*"])), WAIT)
        assert other.value.status == 422 and "not a public address" in other.value.message
        done = await asyncio.wait_for(asyncio.gather(*creates, return_exceptions=True), WAIT)
        assert not never.released.is_set()  # all answered while the lookups still hang
        assert all(isinstance(d, ApiError) and d.status == 422 for d in done), done
        messages = sorted(d.message for d in done if isinstance(d, ApiError))
        assert sum("no answer within" in m for m in messages) == 4, messages
        assert sum("too many of this team's" in m for m in messages) == 8, messages
        assert never.entered == 4
    finally:
        never.released.set()
        await svc.aclose()
        store.close()
