"""The process stream's keepalive (server/routes/streams.py `_chain`): a quiet source yields
None (the route's `: keepalive` comment) while its next item is awaited, that item is never
lost to it, and leaving the stream while an item is awaited closes the source. No VM, no
timing assertion: the source only moves on once the test has seen a keepalive."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from pandastack.server.routes.streams import _chain
from pandastack.server.web.sse import Finished


async def test_a_quiet_source_gets_keepalives_and_loses_nothing() -> None:
    go = asyncio.Event()
    closed = asyncio.Event()

    async def source() -> AsyncGenerator[tuple[str, bytes] | Finished[object], None]:
        try:
            await go.wait()
            yield ("stdout", b"late\n")
            yield Finished(result=None)
        finally:
            closed.set()

    seen: list[object] = []
    async for item in _chain(("stdout", b"first\n"), source(), keepalive=0.01):  # type: ignore[arg-type]
        seen.append(item)
        if item is None:
            go.set()  # only now may the source go on
    assert seen[0] == ("stdout", b"first\n") and None in seen
    assert [s for s in seen if s is not None][1:] == [("stdout", b"late\n"),
                                                       Finished(result=None)]
    assert closed.is_set()


async def test_leaving_while_an_item_is_awaited_closes_the_source() -> None:
    closed = asyncio.Event()

    async def source() -> AsyncGenerator[tuple[str, bytes], None]:
        try:
            await asyncio.Event().wait()  # never
            yield ("stdout", b"never\n")
        finally:
            closed.set()

    stream = _chain(("stdout", b"x"), source(), keepalive=0.01)
    assert await anext(stream) == ("stdout", b"x")
    assert await anext(stream) is None
    await stream.aclose()
    assert closed.is_set()
