"""How an operation ends on the agent client (channel `_operation`): one whose last frame the
caller read sends no `cancel`; one its caller leaves early (a cancelled task, a closed stream,
an error of its own) tells the agent to drop it; either way its id is forgotten (a protocol
error breaks the whole channel instead: nothing more is sent). The guest is a
scripted peer on the real wire protocol."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from pandastack.guestproto import frames as P
from pandastack.host.agentlink.client import AgentClient
from tests.host.fake_guest import FakeGuest, in_thread

pytestmark = pytest.mark.timeout(60)


async def request(fake: FakeGuest, t: str) -> P.Frame:
    f = await in_thread(lambda: fake.recv_until(t))
    assert isinstance(f, P.Frame)
    return f


async def next_frame_after(client: AgentClient, fake: FakeGuest) -> P.Frame:
    """The next frame the guest receives once the client pings (a `cancel`, if one was due,
    comes before the ping: both go out in order on one connection)."""
    ping = asyncio.create_task(client.ping())
    first = await in_thread(fake.recv_frame)
    assert isinstance(first, P.Frame)
    pinged = first if first.t == "ping" else await in_thread(lambda: fake.recv_until("ping"))
    assert isinstance(pinged, P.Frame)
    await in_thread(lambda: fake.send(P.frame("pong", pinged.id)))
    await ping
    return first


async def test_a_listing_read_to_its_end_sends_no_cancel(fake: FakeGuest) -> None:
    client = await fake.client(op_timeout=10)
    task = asyncio.create_task(client.listing("glob", {"path": "/w", "pattern": "*"}))
    req = await request(fake, "glob")
    await in_thread(lambda: fake.send(P.frame("data", req.id, b'["/w/a"]')
                                      + P.frame("eof", req.id, truncated=False)))
    assert (await task).paths == ["/w/a"]
    assert (await next_frame_after(client, fake)).t == "ping"
    assert req.id not in client._ops
    await client.close()


async def test_a_cancelled_caller_cancels_the_operation(fake: FakeGuest) -> None:
    client = await fake.client(op_timeout=10)
    task = asyncio.create_task(client.attach(7))
    req = await request(fake, "attach")
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    cancel = await next_frame_after(client, fake)
    assert (cancel.t, cancel.id) == ("cancel", req.id)
    assert req.id not in client._ops
    await client.close()


async def test_a_stream_closed_early_cancels_and_one_read_through_does_not(
        fake: FakeGuest) -> None:
    client = await fake.client(op_timeout=10)
    stream = client.read_file("/f")
    first = asyncio.create_task(anext(stream))
    req = await request(fake, "read_file")
    await in_thread(lambda: fake.send(P.frame("file", req.id, size=4)
                                      + P.frame("data", req.id, b"abcd")))
    assert await first == b"abcd"
    await stream.aclose()
    cancel = await next_frame_after(client, fake)
    assert (cancel.t, cancel.id) == ("cancel", req.id)

    whole = asyncio.create_task(client.read_file_bytes("/g"))
    req = await request(fake, "read_file")
    await in_thread(lambda: fake.send(P.frame("file", req.id, size=2)
                                      + P.frame("data", req.id, b"ok") + P.frame("eof", req.id)))
    assert await whole == b"ok"
    assert (await next_frame_after(client, fake)).t == "ping"
    await client.close()
