"""`POST /v1/sandboxes/{id}/code` when the guest's interpreter answers with more than the host
accepts, or with JSON nested too deeply: a clear error envelope (413, 503), never a 500 and
never a response built from everything the guest sent. The sandbox's run_code is the real
code client over the real AgentClient, talking to a scripted hostile guest."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from tests.host.agentlink.test_code_hostile import answer_code, event, results
from tests.host.fake_guest import FakeGuest, fake, in_thread
from tests.server.conftest import Api, assert_envelope, make_settings, running_app
from tests.server.fakes import FakeRuntime

pytestmark = pytest.mark.timeout(120)

__all__ = ["fake"]


@pytest.fixture
async def hostile(tmp_path: Path, fake: FakeGuest) -> AsyncIterator[tuple[Api, str]]:
    """An API whose one sandbox runs code through an AgentClient connected to `fake`."""
    runtime = FakeRuntime(tmp_path)
    async with running_app(make_settings(tmp_path), runtime) as api:
        r = await api.client.post("/v1/sandboxes", json={})
        assert r.status_code == 201, r.text
        sandbox_id = r.json()["id"]
        client = await fake.client(op_timeout=10)
        runtime.sandboxes[sandbox_id].run_code = client.run_code  # type: ignore[method-assign]
        try:
            yield api, sandbox_id
        finally:
            await client.close()


async def run(api: Api, sandbox_id: str, fake: FakeGuest, lines: Iterator[bytes]) -> httpx.Response:
    guest = asyncio.create_task(in_thread(lambda: answer_code(fake, lines)))
    r = await api.client.post(f"/v1/sandboxes/{sandbox_id}/code", json={"code": "x"})
    await guest
    return r


async def test_too_many_results_is_413(hostile: tuple[Api, str], fake: FakeGuest) -> None:
    api, sandbox_id = hostile
    r = await run(api, sandbox_id, fake, results(100_000))
    assert_envelope(r, 413, "payload_too_large")
    assert "results" in r.json()["error"]["message"]


async def test_deeply_nested_event_is_503_not_500(
    hostile: tuple[Api, str], fake: FakeGuest
) -> None:
    api, sandbox_id = hostile
    r = await run(api, sandbox_id, fake, iter([b"[" * 100_000 + b"\n"]))
    assert_envelope(r, 503, "unavailable")


async def test_an_honest_run_is_still_200(hostile: tuple[Api, str], fake: FakeGuest) -> None:
    api, sandbox_id = hostile
    lines = iter([event({"type": "stdout", "text": "hi\n"}), *results(2)])
    r = await run(api, sandbox_id, fake, lines)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["stdout"] == "hi\n" and len(body["results"]) == 2


async def test_too_many_results_ends_the_stream_with_a_failure(
    hostile: tuple[Api, str], fake: FakeGuest
) -> None:
    api, sandbox_id = hostile
    guest = asyncio.create_task(in_thread(lambda: answer_code(fake, results(100_000))))
    r = await api.client.post(f"/v1/sandboxes/{sandbox_id}/code/stream", json={"code": "x"})
    await guest
    assert r.status_code == 200
    events = r.text.split("\n\n")
    assert sum(e.startswith("event: result") for e in events) == 10_000
    assert "event: failure" in events[-2] and "payload_too_large" in events[-2]
