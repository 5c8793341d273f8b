"""A hostile guest against the real AgentClient: every buffer the guest fills on the host has a
bound; crossing it fails that operation (or the channel) with a clear error, frees the memory,
and the server process is never at risk. The guest is a scripted peer speaking the real wire
protocol over a socketpair (no VM: here the guest IS the attacker)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import pytest

from pandastack.guestproto import frames as P
from pandastack.host.agentlink import files
from pandastack.host.agentlink.client import AgentClient
from pandastack.hostport.errors import AgentConnectionError, AgentLimitError, AgentProtocolError
from tests.host.fake_guest import FakeGuest, in_thread, traced_peak

pytestmark = pytest.mark.timeout(120)

MiB = 2**20
# What the host may keep queued for one operation (channel.MAX_OP_BUFFER) is 16 MiB of
# accounted bytes; every flood below sends ten times that or more.
OP_BUFFER = 16 * MiB


def deep_header(t: str, op_id: int, depth: int = 30_000) -> bytes:
    """A frame whose header is valid JSON nested `depth` deep (under MAX_HEADER)."""
    header = (f'{{"t":"{t}","id":{op_id},"x":'.encode() + b"[" * depth + b"]" * depth + b"}")
    return P.PREFIX.pack(P.MAGIC, P.VERSION, P.FLAGS, len(header), 0) + header


def answer_pings(fake: FakeGuest, count: int = 1) -> None:
    for _ in range(count):
        f = fake.recv_until("ping")
        fake.send(P.frame("pong", f.id))


async def assert_still_usable(client: AgentClient, fake: FakeGuest) -> None:
    pong = asyncio.create_task(in_thread(lambda: answer_pings(fake)))
    assert await asyncio.wait_for(client.ping(), 10) >= 0
    await pong
    assert not client.broken


# -- per-operation queues ------------------------------------------------------------------


@pytest.mark.parametrize("junk_type", ["info", "entries"])
async def test_upload_flooded_with_control_frames_fails_the_upload(
    fake: FakeGuest, junk_type: str
) -> None:
    """While an upload waits for credit, the guest sends it 160 frames of 1 MiB that no
    upload has. `info` is a reply: the first one ends the upload as a protocol error (the
    channel breaks, as for any reply of the wrong type) and the rest is dropped. `entries`
    with more:true ends nothing: the op's queue bound fails the upload alone. Either way the
    host never holds the 160 MiB nobody reads."""
    client = await fake.client(op_timeout=10)
    upload = asyncio.create_task(client.write_file("/x", bytes(4 * P.INITIAL_WINDOW)))

    def take_window() -> int:
        req = fake.recv_until("write_file")
        for _ in range(P.INITIAL_WINDOW // P.MAX_CHUNK):
            assert fake.recv_until("data").id == req.id
        return req.id

    op_id = await in_thread(take_window)
    assert isinstance(op_id, int)
    junk = P.frame(junk_type, op_id, bytes(P.MAX_PAYLOAD), more=True)
    expected = AgentProtocolError if junk_type == "info" else AgentLimitError

    def flood() -> None:
        with contextlib.suppress(OSError):  # a broken client hangs up
            for _ in range(160):
                fake.send(junk)

    with traced_peak() as peak:
        sender = asyncio.get_running_loop().run_in_executor(None, flood)
        with pytest.raises(expected, match="write_file"):
            await asyncio.wait_for(upload, 30)
        await sender
        assert peak() < 2 * OP_BUFFER
    if junk_type == "info":
        assert client.broken
    else:
        assert await in_thread(lambda: fake.recv_until("cancel").id) == op_id
        await assert_still_usable(client, fake)
    await client.close()


async def test_stalled_download_flooded_with_file_headers(fake: FakeGuest) -> None:
    """A download whose reader pauses after one chunk gets `file` frames with 60 KB headers
    of nested JSON (~1.5 MB each once parsed): the bound counts the parsed cost, not the
    wire bytes, so the host stops after a few instead of holding 150 MB."""
    client = await fake.client(op_timeout=10)
    it = client.read_file("/x")
    first = asyncio.create_task(it.__anext__())
    req = await in_thread(lambda: fake.recv_until("read_file"))
    assert isinstance(req, P.Frame)
    await in_thread(lambda: fake.send(P.frame("file", req.id, size=10)
                                      + P.frame("data", req.id, b"0123456789")))
    assert await first == b"0123456789"  # and then the consumer stops reading
    junk = P.frame("file", req.id, size=1, pad=[{}] * 20_000)
    assert len(junk) < P.MAX_HEADER + P.PREFIX_SIZE
    with traced_peak() as peak:
        await in_thread(lambda: fake.send_many(junk, 100))
        await asyncio.sleep(0.2)  # let the reader take the last bytes
        assert peak() < 2 * OP_BUFFER
    with pytest.raises(AgentLimitError):
        await asyncio.wait_for(it.__anext__(), 10)
    await it.aclose()
    await assert_still_usable(client, fake)
    await client.close()


async def test_stalled_exec_flooded_with_empty_output_frames(fake: FakeGuest) -> None:
    """Empty `stdout` frames use no credit, yet each costs a queue slot: 200 000 of them
    while the exec's output callback is blocked end the exec, not the host's memory."""
    client = await fake.client(op_timeout=5)
    gate = asyncio.Event()

    async def slow_consumer(data: bytes) -> None:
        await gate.wait()

    task = asyncio.create_task(client.exec("x", timeout=60, on_stdout=slow_consumer))
    req = await in_thread(lambda: fake.recv_until("exec"))
    assert isinstance(req, P.Frame)
    empty = P.frame("stdout", req.id)
    batch = empty * 10_000
    with traced_peak() as peak:
        await in_thread(lambda: fake.send(P.frame("stdout", req.id, b"a")))
        await in_thread(lambda: fake.send_many(batch, 20))
        await asyncio.sleep(0.2)
        assert peak() < 2 * OP_BUFFER
    gate.set()
    with pytest.raises(AgentLimitError):
        await asyncio.wait_for(task, 10)
    await assert_still_usable(client, fake)
    await client.close()


# -- results that grow while the guest keeps sending -----------------------------------------


ENTRY = {"name": "f", "path": "/d/f", "type": "file", "size": 1, "mode": 0o644, "mtime": 1.0}


async def test_list_dir_that_never_ends_is_cut_at_its_bound(
    fake: FakeGuest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`more: true` forever: the listing stops at its entries bound with a clear error, the
    guest is told to cancel, and the partial list is freed (10x the bound was sent)."""
    monkeypatch.setattr(files, "MAX_LIST_ENTRIES", 10_000)
    client = await fake.client(op_timeout=10)
    task = asyncio.create_task(client.list_dir("/d"))
    req = await in_thread(lambda: fake.recv_until("list"))
    assert isinstance(req, P.Frame)
    page = P.frame("entries", req.id, json.dumps([ENTRY] * 1000).encode(), more=True)
    with traced_peak() as peak:
        await in_thread(lambda: fake.send_many(page, 100))
        with pytest.raises(AgentLimitError, match="10000 entries"):
            await asyncio.wait_for(task, 30)
        assert peak() < 12 * MiB
    assert await in_thread(lambda: fake.recv_until("cancel").id) == req.id
    await assert_still_usable(client, fake)
    await client.close()


async def test_list_dir_bytes_are_bounded_too(
    fake: FakeGuest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Few entries, but each with a name of almost 1 MiB."""
    monkeypatch.setattr(files, "MAX_LIST_BYTES", 4 * MiB)
    client = await fake.client(op_timeout=10)
    task = asyncio.create_task(client.list_dir("/d"))
    req = await in_thread(lambda: fake.recv_until("list"))
    assert isinstance(req, P.Frame)
    big = json.dumps([{**ENTRY, "name": "n" * (P.MAX_PAYLOAD - 200)}]).encode()
    page = P.frame("entries", req.id, big, more=True)
    with traced_peak() as peak:
        await in_thread(lambda: fake.send_many(page, 40))
        with pytest.raises(AgentLimitError):
            await asyncio.wait_for(task, 30)
        assert peak() < 16 * MiB
    await assert_still_usable(client, fake)
    await client.close()


async def test_procs_listing_is_bounded(fake: FakeGuest) -> None:
    client = await fake.client(op_timeout=10)
    task = asyncio.create_task(client.procs())
    req = await in_thread(lambda: fake.recv_until("procs"))
    assert isinstance(req, P.Frame)
    items = b"[" + b",".join([b'{"pid":1}'] * 100_000) + b"]"
    await in_thread(lambda: fake.send(P.frame("proc_list", req.id, items, count=100_000)))
    with pytest.raises(AgentLimitError, match="processes"):
        await asyncio.wait_for(task, 10)
    await assert_still_usable(client, fake)
    await client.close()


async def test_read_file_bytes_stops_at_its_limit(fake: FakeGuest) -> None:
    client = await fake.client(op_timeout=10)
    task = asyncio.create_task(client.read_file_bytes("/x", limit=3 * P.MAX_CHUNK))
    req = await in_thread(lambda: fake.recv_until("read_file"))
    assert isinstance(req, P.Frame)
    chunk = P.frame("data", req.id, bytes(P.MAX_CHUNK))
    await in_thread(lambda: fake.send(P.frame("file", req.id, size=1) + chunk * 4))
    with pytest.raises(AgentLimitError, match="read_file"):
        await asyncio.wait_for(task, 10)
    assert await in_thread(lambda: fake.recv_until("cancel").id) == req.id
    await client.close()


# -- JSON nested too deeply ------------------------------------------------------------------


@pytest.mark.parametrize("call", ["list_dir", "procs"])
async def test_deeply_nested_json_payload_is_a_protocol_error(fake: FakeGuest, call: str) -> None:
    """json.loads raises RecursionError (not ValueError) on deep nesting: that must be a
    protocol error like any malformed payload, never an unexpected exception."""
    client = await fake.client(op_timeout=10)
    task = asyncio.create_task(client.list_dir("/d") if call == "list_dir" else client.procs())
    req = await in_thread(lambda: fake.recv_frame())
    assert isinstance(req, P.Frame)
    reply = "entries" if call == "list_dir" else "proc_list"
    await in_thread(lambda: fake.send(P.frame(reply, req.id, b"[" * 100_000, more=False)))
    with pytest.raises(AgentProtocolError):
        await asyncio.wait_for(task, 10)
    await client.close()


async def test_deeply_nested_header_breaks_the_channel_at_once(fake: FakeGuest) -> None:
    """A header nested 30 000 deep made the decoder raise RecursionError, which killed the
    reader task without marking the client broken: calls then hung until their timeouts."""
    client = await fake.client(op_timeout=20)
    t0 = time.monotonic()
    pending = [asyncio.create_task(client.exec("x")), asyncio.create_task(client.ping())]
    req = await in_thread(lambda: fake.recv_until("ping"))
    assert isinstance(req, P.Frame)
    await in_thread(lambda: fake.send(deep_header("pong", req.id)))
    for task in pending:
        with pytest.raises(AgentProtocolError, match="invalid frame"):
            await asyncio.wait_for(task, 10)
    assert client.broken
    with pytest.raises(AgentProtocolError):  # a later call fails at once too
        await asyncio.wait_for(client.ping(), 10)
    assert time.monotonic() - t0 < 5
    await client.close()


async def test_deeply_nested_hello_fails_the_handshake_cleanly(fake: FakeGuest) -> None:
    def answer() -> None:
        fake.recv_until("hello")
        fake.send(deep_header("hello", 0, depth=2000))  # small enough to be a candidate

    t = asyncio.create_task(in_thread(answer))
    with pytest.raises(AgentConnectionError):  # skipped like garbage, then the deadline
        await AgentClient.from_socket(fake.host_end, timeout=1.0)
    await t


# -- the reader task -------------------------------------------------------------------------


async def test_any_exception_in_the_reader_breaks_the_client(fake: FakeGuest) -> None:
    """Whatever goes wrong in the reader task, every pending operation fails at once with a
    connection error and the client is marked broken, instead of a silent death."""
    client = await fake.client(op_timeout=20)

    def boom(f: P.Frame) -> None:
        raise RuntimeError("boom")

    client._dispatch = boom  # type: ignore[method-assign]
    t0 = time.monotonic()
    pending = [asyncio.create_task(client.exec("x")), asyncio.create_task(client.ping())]
    req = await in_thread(lambda: fake.recv_until("ping"))
    assert isinstance(req, P.Frame)
    await in_thread(lambda: fake.send(P.frame("pong", req.id)))
    for task in pending:
        with pytest.raises(AgentConnectionError, match="RuntimeError: boom"):
            await asyncio.wait_for(task, 10)
    assert client.broken and time.monotonic() - t0 < 5
    with pytest.raises(AgentConnectionError):
        await client.ping()
    await client.close()
