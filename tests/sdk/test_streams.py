"""Against a real uvicorn server over the in-memory runtime (tests/server/serve_fake.py): the
process stream route and both SDK twins of `stream()`/`connect()`/callbacks, `Sandbox.list`
pages and filters, `set_timeout` (from now) beside `set_ttl` (from creation), `is_running`.
The real guest is tested in tests/e2e/test_sdk_streams.py. Fast."""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from pandastack.sdk import (
    AsyncClient,
    AsyncSandbox,
    Client,
    InvalidRequestError,
    NotFoundError,
    ProcessEvent,
    Sandbox,
)
from pandastack.sdk._streams import KEPT_CHARS, ProcessStreamDecoder
from tests.server.live import FakeServer, fake_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeServer]:
    with fake_server(tmp_path_factory.mktemp("sdk-streams")) as srv:
        yield srv


def creds(server: FakeServer) -> dict[str, Any]:
    return {"api_url": server.url, "api_key": server.admin_key}


# The fake's attach: a replay note (3 bytes of stdout dropped), one chunk each, the exit.
EXPECTED = [("dropped", "", {"stdout": 3, "stderr": 0}), ("stdout", "out\n", {}),
            ("stderr", "err\n", {}), ("exit", "", {})]


def shape(events: list[ProcessEvent]) -> list[tuple[str, str, dict[str, int]]]:
    return [(e.type, e.data, dict(e.dropped)) for e in events]


def test_decoder_takes_the_stream_in_any_pieces() -> None:
    wire = (b'event: dropped\ndata: {"stdout":5,"stderr":0}\n\n'
            b'event: stdout\ndata: {"data":"h\xc3\xa9"}\n\n'
            b'event: future\ndata: {}\n\n'
            b'event: exit\ndata: {"exit_code":0,"stdout":"","stderr":"","duration_ms":1.0}\n\n')
    decoder = ProcessStreamDecoder()
    events = [e for i in range(len(wire)) for e in decoder.feed(wire[i:i + 1])]
    assert [e.type for e in events] == ["dropped", "stdout", "exit"]
    assert events[0].dropped == {"stdout": 5, "stderr": 0} and events[1].data == "hé"
    assert events[2].result is not None and events[2].result.stdout == "hé"


def test_decoder_keeps_a_bounded_tail_for_the_result() -> None:
    decoder = ProcessStreamDecoder()
    chunk = "x" * 4095 + "\n"
    for _ in range(3 * KEPT_CHARS // len(chunk)):
        decoder.feed(b'event: stdout\ndata: {"data":"' + chunk.replace("\n", "\\n").encode()
                     + b'"}\n\n')
    decoder.feed(b'event: stdout\ndata: {"data":"end"}\n\n')
    [done] = decoder.feed(b'event: exit\ndata: {"exit_code":0,"stdout":"","stderr":"",'
                          b'"duration_ms":1.0}\n\n')
    assert done.result is not None
    assert len(done.result.stdout) == KEPT_CHARS and done.result.stdout.endswith("x\nend")
    assert sum(len(c) for c in decoder._chunks["stdout"]) <= 2 * KEPT_CHARS + len(chunk)


def test_sync_stream_connect_and_callbacks(server: FakeServer) -> None:
    with Sandbox.create(ttl_seconds=300, **creds(server)) as sbx:
        seen: list[tuple[str, str]] = []
        proc = sbx.commands.start("loop", timeout_seconds=5,
                                  on_stdout=lambda t: seen.append(("out", t)),
                                  on_stderr=lambda t: seen.append(("err", t)))
        events = list(proc.stream())
        assert shape(events) == EXPECTED
        assert events[-1].result is not None and events[-1].result.stdout == "out\n"
        assert seen == [("out", "out\n"), ("err", "err\n")]
        seen.clear()
        result = proc.wait()  # with callbacks: streamed to them
        assert (result.stdout, result.stderr) == ("out\n", "err\n") and len(seen) == 2

        with Sandbox.connect(sbx.id, **creds(server)) as other:
            again = other.commands.connect(proc.pid)
            assert again.pid == proc.pid and again.info.running
            assert shape(list(again.stream())) == EXPECTED
            with pytest.raises(NotFoundError):
                other.commands.connect(7)
        with pytest.raises(InvalidRequestError):
            sbx.commands.start("x", timeout_seconds=0)


async def test_async_stream_connect_and_callbacks(server: FakeServer) -> None:
    async with await AsyncSandbox.create(ttl_seconds=300, **creds(server)) as sbx:
        seen: list[str] = []

        async def on_stdout(text: str) -> None:
            seen.append(text)

        proc = await sbx.commands.start(["loop"], timeout_seconds=5, on_stdout=on_stdout)
        events = [e async for e in proc.stream()]
        assert shape(events) == EXPECTED and seen == ["out\n"]
        other = await sbx.commands.connect(proc.pid)
        assert (await other.wait()).exit_code == 0  # no callbacks: the wait route
        with pytest.raises(NotFoundError):
            await sbx.commands.connect(7)


def test_the_stream_route_is_server_sent_events(server: FakeServer) -> None:
    with Sandbox.create(ttl_seconds=300, **creds(server)) as sbx:
        proc = sbx.commands.start("loop")
        r = httpx.get(f"{server.url}/v1/sandboxes/{sbx.id}/processes/{proc.pid}/stream",
                      headers=server.headers(), timeout=10)
        assert r.status_code == 200 and r.headers["content-type"].startswith(
            "text/event-stream")
        names = [line.removeprefix("event: ") for line in r.text.splitlines()
                 if line.startswith("event: ")]
        assert names == ["dropped", "stdout", "stderr", "exit"]
        gone = httpx.get(f"{server.url}/v1/sandboxes/sbx-none/processes/1/stream",
                         headers=server.headers(), timeout=10)
        assert gone.status_code == 404


def test_list_pages_by_keyset_with_filters(server: FakeServer) -> None:
    label = {"suite": secrets.token_hex(4)}
    with Client(**creds(server)) as client:
        made = [client.sandboxes.create(ttl_seconds=300, metadata=label) for _ in range(5)]
        other = client.sandboxes.create(ttl_seconds=300, metadata={"suite": "someone-else"})
        first = Sandbox.list(metadata=label, limit=2, **creds(server))
        assert [s.id for s in first] == [m.id for m in made[:2]]
        assert first.next_token is not None
        # Creations and ends between pages shift nothing: no row is skipped or repeated.
        made[0].kill()
        made.append(client.sandboxes.create(ttl_seconds=300, metadata=label))
        ids = [s.id for s in first]
        token: str | None = first.next_token
        pages = 1
        while token is not None and pages < 10:
            page = client.sandboxes.list(metadata=label, include_ended=True, limit=2,
                                         next_token=token)
            ids += [s.id for s in page]
            token, pages = page.next_token, pages + 1
        assert ids == [m.id for m in made]
        assert [s.id for s in client.sandboxes.list(metadata=label)] == [m.id for m in made[1:]]
        assert client.sandboxes.list(metadata=label).next_token is None

        after = made[2].info.created_at
        later = client.sandboxes.list(metadata=label, started_after=after)
        assert [s.id for s in later] == [m.id for m in made[3:]]
        assert client.sandboxes.list(metadata=label, template="no-such-template") == []
        assert [s.id for s in client.sandboxes.list(metadata=label, template="base")] == [
            m.id for m in made[1:]]
        with pytest.raises(InvalidRequestError):
            client.sandboxes.list(next_token="not-a-token")
        for s in [*made[1:], other]:
            s.kill()
        for page_item in first:
            page_item.close()


def test_set_timeout_counts_from_now_and_is_running(server: FakeServer) -> None:
    with Sandbox.create(ttl_seconds=60, **creds(server)) as sbx:
        created = sbx.info.created_at
        before = time.time()
        lc = sbx.set_timeout(3600)
        after = time.time()
        # The TTL that ends then: expires_at = created_at + ttl_seconds still holds.
        assert lc.expires_at == created + lc.ttl_seconds
        assert math.floor(before + 3600 - created) <= lc.ttl_seconds <= math.ceil(
            after + 3600 - created)
        assert sbx.set_ttl(120).expires_at == created + 120
        both = httpx.patch(f"{server.url}/v1/sandboxes/{sbx.id}/lifecycle",
                           json={"ttl_seconds": 60, "timeout_seconds": 60},
                           headers=server.headers(), timeout=10)
        assert both.status_code == 400

        assert sbx.is_running() is True
        sbx.pause()
        assert sbx.is_running() is False and sbx.info.state == "paused"
        sbx.resume()
        assert sbx.is_running() is True
        sbx.kill()
        assert sbx.is_running() is False


async def test_async_set_timeout_and_is_running(server: FakeServer) -> None:
    async with AsyncClient(**creds(server)) as client:
        sbx = await client.sandboxes.create(ttl_seconds=60)
        spare = await client.sandboxes.create(ttl_seconds=60)
        lc = await sbx.set_timeout(600)
        assert lc.ttl_seconds >= 600 and lc.expires_at == sbx.info.created_at + lc.ttl_seconds
        assert await sbx.is_running() is True
        page = await AsyncSandbox.list(limit=1, **creds(server))
        assert len(page) == 1 and page.next_token is not None
        for s in page:
            await s.close()
        await spare.kill()
        await sbx.kill()
        assert await sbx.is_running() is False
