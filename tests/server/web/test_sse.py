"""`sse.relayed`, behind every streaming route: items in order, then the work's outcome; a
client that goes away cancels the work. No server needed."""

from __future__ import annotations

import asyncio

import pytest

from pandastack.server.web.sse import Finished, relayed


async def test_items_then_the_result() -> None:
    async def work(queue: asyncio.Queue[int | None]) -> str:
        for i in range(5):  # more than the queue holds: the reader keeps up
            await queue.put(i)
        return "done"

    seen = [item async for item in relayed(work, queue_size=2)]
    assert seen == [0, 1, 2, 3, 4, Finished(result="done")]


async def test_items_then_the_error() -> None:
    async def work(queue: asyncio.Queue[int | None]) -> str:
        await queue.put(1)
        raise ValueError("bad")

    seen = [item async for item in relayed(work, queue_size=4)]
    assert seen[0] == 1
    assert isinstance(seen[1], Finished) and isinstance(seen[1].error, ValueError)
    assert len(seen) == 2


async def test_a_client_that_leaves_cancels_the_work() -> None:
    cancelled = asyncio.Event()

    async def work(queue: asyncio.Queue[int | None]) -> None:
        try:
            await queue.put(1)
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    stream = relayed(work, queue_size=4)
    assert await anext(stream) == 1
    await stream.aclose()  # what Starlette does when the client disconnects
    assert cancelled.is_set()


@pytest.mark.parametrize("size", [1, 64])
async def test_nothing_put_is_just_the_outcome(size: int) -> None:
    async def work(queue: asyncio.Queue[int | None]) -> int:
        return 7

    assert [item async for item in relayed(work, queue_size=size)] == [Finished(result=7)]
