"""Events and webhooks through the REST API and the SDK, against one real uvicorn server over
the in-memory host (tests/server/serve_fake.py): the stream in order with the key as actor,
resumed with Last-Event-ID, filtered by type, scoped to the team and numbered in its own
sequence (an admin may read another team's, by the log's global ids), quota.exceeded, bad
arguments; webhooks created, listed, tested, delivered to a loopback receiver with a
signature that verifies, deleted; private targets refused unless allowed (this server allows
them: the receiver is on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pandastack import Client
from pandastack.sdk import AsyncClient
from pandastack.sdk.errors import APIError, InvalidRequestError
from pandastack.sdk.events import EventStream
from pandastack.webhooks import verify_signature
from pandastack.wire.events import Event
from tests.server.live import FakeServer, fake_server
from tests.server.webhook_receiver import receiver


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeServer]:
    tmp: Path = tmp_path_factory.mktemp("events")
    with fake_server(tmp, webhook_allow_private=True, max_event_streams_per_team=2) as srv:
        yield srv


def take(stream: EventStream, count: int, timeout: float = 60.0) -> list[Event]:
    """The next `count` events (the stream is stopped if they do not come in time)."""
    timer = threading.Timer(timeout, stream.stop)
    timer.start()
    try:
        got: list[Event] = []
        for e in stream:
            got.append(e)
            if len(got) == count:
                break
        return got
    finally:
        timer.cancel()


def test_stream_order_resume_filter_and_scope(server: FakeServer) -> None:
    with Client(server.url, server.admin_key) as admin:
        me = next(k for k in admin.keys.list() if server.admin_key.startswith(k.prefix))
        other_key = admin.keys.create("ev", team="events-other").key
        with admin.events.stream(types=["sandbox.*"]) as stream:
            sbx = admin.sandboxes.create(ttl_seconds=600)
            sbx.pause()
            sbx.resume()
            fork = sbx.fork(1)
            sbx.snapshot()
            sbx.kill()
            got = take(stream, 6)
            last = stream.last_id
        assert [e.type for e in got] == ["sandbox.created", "sandbox.paused",
                                         "sandbox.resumed", "sandbox.forked",
                                         "sandbox.snapshotted", "sandbox.killed"]
        assert all(e.sandbox_id == sbx.id and e.actor == me.id for e in got)
        children = fork
        assert got[3].model_extra is not None
        assert got[3].model_extra["children"] == [c.id for c in children]
        assert got[0].id < got[5].id == last

        # Resumed after the second event: the rest again, from the log.
        with admin.events.stream(types="sandbox.*", after=got[1].id) as again:
            assert [e.id for e in take(again, 4)] == [e.id for e in got[2:]]
        for c in children:
            c.kill()

        with Client(server.url, other_key) as other:
            with other.events.stream() as theirs:
                made = other.sandboxes.create()
                made.kill()
                seen = take(theirs, 2)
            assert [e.type for e in seen] == ["sandbox.created", "sandbox.killed"]
            assert {e.team for e in seen} == {"events-other"}
            # The team's own sequence: the admin's team's events above did not move it.
            assert [e.id for e in seen] == [1, 2] and "seq" not in (seen[0].model_extra or {})
            # An admin key reads the log's global ids (the team's number as `seq`), and
            # resumes by them.
            with admin.events.stream(team="events-other", after=got[-1].id) as peek:
                peeked = take(peek, 2)
            assert [(e.model_extra or {}).get("seq") for e in peeked] == [1, 2]
            assert got[-1].id < peeked[0].id < peeked[1].id
            with admin.events.stream(team="events-other", after=peeked[0].id) as peek:
                assert [e.id for e in take(peek, 1)] == [peeked[1].id]
            with pytest.raises(APIError) as denied:
                other.events.stream(team="default")
            assert denied.value.status == 403

            # quota.exceeded is written although the refused create rolled back.
            admin.teams.set_quota("events-other", max_sandboxes=0)
            with other.events.stream(types=["quota.exceeded"]) as quota:
                with pytest.raises(APIError) as refused:
                    other.sandboxes.create()
                assert refused.value.status == 429
                [q] = take(quota, 1)
            assert q.model_extra is not None and q.model_extra["limit"] == "max_sandboxes"
            admin.teams.set_quota("events-other", clear=["max_sandboxes"])

    with pytest.raises(InvalidRequestError):
        Client(server.url, server.admin_key).events.stream(types=["sandbox.nope"])
    h = server.headers()
    r = httpx.get(f"{server.url}/v1/events", headers={**h, "Last-Event-ID": "x"})
    assert r.status_code == 422
    r = httpx.get(f"{server.url}/v1/events", params={"types": "nope"}, headers=h)
    assert r.status_code == 422


async def test_streams_per_team_are_bounded(server: FakeServer) -> None:
    async with AsyncClient(server.url, server.admin_key) as client:
        a = await client.events.stream()
        b = await client.events.stream()
        try:
            with pytest.raises(APIError) as over:
                await client.events.stream()
            assert over.value.status == 429
        finally:
            await a.stop()
            await b.stop()
        for _ in range(100):  # the slots are freed as the server sees the streams close
            try:
                c = await client.events.stream()
            except APIError:
                await asyncio.sleep(0.1)
                continue
            await c.stop()
            break
        else:
            raise AssertionError("the closed streams' slots were never freed")


def test_webhooks_over_the_api(server: FakeServer) -> None:
    with receiver() as r, Client(server.url, server.admin_key) as client:
        made = client.webhooks.create(r.url, ["sandbox.created", "sandbox.killed"],
                                      description="ci")
        assert made.secret.startswith("whsec_")
        listed = client.webhooks.list()
        assert [w.id for w in listed] == [made.id] and not hasattr(listed[0], "secret")
        assert client.webhooks.get(made.id).events == ["sandbox.created", "sandbox.killed"]
        test = client.webhooks.test(made.id)
        assert (test.status, test.response_status) == ("delivered", 204)

        sbx = client.sandboxes.create()
        sbx.kill()
        got = r.wait_for(3)
        events = [verify_signature(made.secret, g.headers, g.body) for g in got]
        # The test delivery was answered before the sandbox existed; the two after it may
        # arrive in either order (ADR 0035: consumers order by event id), and under load
        # they did.
        events[1:] = sorted(events[1:], key=lambda e: int(e["id"]))
        assert [e["type"] for e in events] == ["webhook.test", "sandbox.created",
                                               "sandbox.killed"]
        assert events[1]["sandbox_id"] == sbx.id
        for _ in range(100):  # recorded just after the receiver answered
            log = client.webhooks.deliveries(made.id)
            if all(d.status == "delivered" for d in log) and len(log) == 3:
                break
            threading.Event().wait(0.1)
        assert [d.event_type for d in log] == ["sandbox.killed", "sandbox.created",
                                               "webhook.test"]
        assert all(d.status == "delivered" and d.attempts == 1 for d in log)

        with pytest.raises(InvalidRequestError):
            client.webhooks.create("ftp://example/", ["*"])
        with pytest.raises(APIError) as bad:
            client.webhooks.create(r.url, ["sandbox.nope"])
        assert bad.value.status == 422
        client.webhooks.delete(made.id)
        assert client.webhooks.list() == []
        with pytest.raises(APIError) as gone:
            client.webhooks.get(made.id)
        assert gone.value.status == 404
