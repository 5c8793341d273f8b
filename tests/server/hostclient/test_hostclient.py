"""HostClient against the host app on a real uvicorn over a unix socket, with a host port in
memory playing the runtime (tests/host/api/fake_host.py): every HostError class comes back
as itself; output, file reads and file writes stream piece by piece both ways, with the
reader's pace holding the writer back; a caller that leaves mid-exec cancels it on the
agent; an agent that is gone or stuck is HostUnavailable."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from pandastack.hostport import errors as E
from pandastack.hostport.errors import HostError, HostUnavailable, SandboxNotFound
from pandastack.hostport.host_api.codec import error_classes
from pandastack.server.hostclient import HostClient, Timeouts
from tests.host.api.fake_host import Emit, FakeHost, served
from tests.hostport.test_codec import sample
from tests.leftovers import owned_tmpdir

TOKEN = "t0ken"
POLL = 0.01


@contextlib.contextmanager
def private_dir() -> Iterator[Path]:
    path = owned_tmpdir("phc-")  # short: a socket lives in it
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def tmp() -> Iterator[Path]:
    with private_dir() as path:
        yield path


@pytest.fixture(scope="module")
async def host_app() -> AsyncIterator[tuple[str, FakeHost]]:
    """One host app for the module's tests (its start is most of a test's time); `agent`
    gives each test the fake host afresh."""
    host = FakeHost()
    with private_dir() as directory:
        async with served(host, TOKEN, directory) as url:
            yield url, host


@pytest.fixture
async def agent(host_app: tuple[str, FakeHost]) -> AsyncIterator[tuple[HostClient, FakeHost]]:
    url, host = host_app
    host.sandboxes.clear()
    host.fail.clear()
    host.add("sbx-1")
    async with HostClient(url, TOKEN) as client:
        yield client, host


async def until(condition: object, what: str, limit: float = 10.0) -> None:
    """Wait for `condition()` (a guard against hanging, not a measurement)."""
    async with asyncio.timeout(limit):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(POLL)


CLASSES = sorted(error_classes().items())


@pytest.mark.parametrize(("name", "cls"), CLASSES, ids=[n for n, _ in CLASSES])
async def test_every_error_comes_back_as_itself(agent: tuple[HostClient, FakeHost],
                                                name: str, cls: type[Exception]) -> None:
    client, host = agent
    original = sample(cls)
    host.fail["kill"] = original
    with pytest.raises(cls) as caught:
        await client.kill("sbx-1")
    assert type(caught.value) is cls
    assert str(caught.value) == str(original) and vars(caught.value) == vars(original)

    async def fails(_out: Emit, _err: Emit) -> int:
        raise original

    sbx = await client.get("sbx-1")
    host.sandboxes["sbx-1"].script["fail"] = fails
    with pytest.raises(cls) as streamed:  # the same after the stream's 200: its ERROR frame
        await sbx.exec("fail")
    assert type(streamed.value) is cls and vars(streamed.value) == vars(original)


async def test_lookups(agent: tuple[HostClient, FakeHost]) -> None:
    client, host = agent
    sbx = await client.get("sbx-1")
    assert (sbx.id, sbx.state, sbx.is_alive()) == ("sbx-1", "running", True)
    host.sandboxes["sbx-1"].state = "paused"
    assert sbx.state == "running"  # as of its lookup
    assert [s.state for s in await client.list_sandboxes()] == ["paused"]
    with pytest.raises(SandboxNotFound, match="no sandbox sbx-2"):
        await client.get("sbx-2")
    assert await client.console_log("sbx-1", 4) == b"oot\xff"
    assert (await client.status()).sandboxes == 1


async def test_exec_output_reaches_the_callbacks_as_it_comes(
        agent: tuple[HostClient, FakeHost]) -> None:
    client, host = agent
    first_seen = asyncio.Event()

    async def script(out: Emit, err: Emit) -> int:
        await out(b"first ")
        await first_seen.wait()  # the rest only once the caller saw the first part
        await err(b"warn")
        await out(b"second")
        return 7

    host.sandboxes["sbx-1"].script["talk"] = script
    seen: list[tuple[str, bytes]] = []

    async def on_stdout(data: bytes) -> None:
        seen.append(("out", data))
        first_seen.set()

    result = await (await client.get("sbx-1")).exec(
        "talk", on_stdout=on_stdout, on_stderr=lambda d: seen.append(("err", d)))
    assert seen == [("out", b"first "), ("err", b"warn"), ("out", b"second")]
    assert (result.exit_code, result.stdout, result.stderr) == (7, b"first second", b"warn")


async def test_a_slow_reader_holds_the_guest_back(agent: tuple[HostClient, FakeHost]) -> None:
    """The agent queues about a megabyte, not the whole output, for a reader that waits."""
    client, host = agent
    total, chunk = 64 * 2**20, 64 * 2**10
    produced = [0]

    async def flood(out: Emit, _err: Emit) -> int:
        while produced[0] < total:
            await out(bytes(chunk))
            produced[0] += chunk
        return 0

    host.sandboxes["sbx-1"].script["flood"] = flood
    release = asyncio.Event()

    async def slow(_data: bytes) -> None:
        await release.wait()

    run = asyncio.create_task((await client.get("sbx-1")).exec("flood", on_stdout=slow))
    stable = [0, -1]

    def stalled() -> bool:
        stable[0] = stable[0] + 1 if produced[0] == stable[1] else 0
        stable[1] = produced[0]
        return stable[0] >= 50 or produced[0] >= total
    await until(stalled, "the producer to stall or finish", limit=60)
    assert produced[0] < total // 4, f"the agent ran {produced[0]} bytes ahead of its reader"
    release.set()
    result = await run
    assert len(result.stdout) == total


async def test_leaving_mid_exec_cancels_it_on_the_agent(
        agent: tuple[HostClient, FakeHost]) -> None:
    client, host = agent
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def forever(_out: Emit, _err: Emit) -> int:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return 0

    host.sandboxes["sbx-1"].script["sleep"] = forever
    run = asyncio.create_task((await client.get("sbx-1")).exec("sleep"))
    await asyncio.wait_for(started.wait(), 10)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    await asyncio.wait_for(cancelled.wait(), 10)


async def test_file_bodies_stream_both_ways(agent: tuple[HostClient, FakeHost]) -> None:
    client, host = agent
    fake = host.sandboxes["sbx-1"]
    sbx = await client.get("sbx-1")
    arrived = asyncio.Event()
    fake.on_chunk = lambda size: arrived.set()
    part = os.urandom(300_000)

    async def body() -> AsyncIterator[bytes]:
        yield part
        await asyncio.wait_for(arrived.wait(), 10)  # the agent has it before the rest exists
        yield part

    assert await sbx.write_file("/f", body()) == 2 * len(part)
    assert fake.files["/f"] == part * 2 and len(fake.chunks_seen) > 1

    got_first = asyncio.Event()

    async def guest_file() -> AsyncIterator[bytes]:
        yield b"a" * 1000
        await asyncio.wait_for(got_first.wait(), 10)
        yield b"b" * 1000

    fake.file_reads["/g"] = guest_file
    chunks = []
    async for chunk in sbx.read_file("/g"):
        chunks.append(chunk)
        got_first.set()
    assert chunks == [b"a" * 1000, b"b" * 1000]
    assert await sbx.write_file("/h", b"whole") == 5 and fake.files["/h"] == b"whole"
    assert b"".join([c async for c in sbx.read_file("/f")]) == part * 2


async def test_wrong_token(tmp: Path) -> None:
    async with served(FakeHost(), TOKEN, tmp) as url:
        client = HostClient(url, "not-it")
        with pytest.raises(HostError, match="refused the token") as caught:
            await client.start()
        assert type(caught.value) is HostError
        await client.close()


async def test_no_agent_is_unavailable_at_once(tmp: Path) -> None:
    for url in (f"unix:{tmp}/none.sock", "127.0.0.1:9"):
        client = HostClient(url, TOKEN)
        with pytest.raises(HostUnavailable, match=f"host agent at {url}"):
            await asyncio.wait_for(client.get("sbx-1"), 10)
        await client.close()


async def test_a_stuck_agent_is_unavailable_after_the_lookup_timeout(tmp: Path) -> None:
    host = FakeHost()
    host.stalling = True
    async with served(host, TOKEN, tmp) as url:
        client = HostClient(url, TOKEN, timeouts=Timeouts(lookup=0.3))
        with pytest.raises(HostUnavailable, match="did not answer in time"):
            await asyncio.wait_for(client.get("sbx-1"), 10)
        await client.close()
        host.stall.set()


def test_addresses() -> None:
    for bad in ("unix:relative.sock", "nohost"):
        with pytest.raises(ValueError, match="agent address"):
            HostClient(bad, TOKEN)
    assert E.HostUnavailable.__mro__[1] is HostError
