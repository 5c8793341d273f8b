"""Streamed reads of a file (`sbx.filesystem.read(path, format="stream")`): `ByteStream` and
its async twin `AsyncByteStream`, the file's bytes as they arrive."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from typing import Any

from pandastack.sdk._base import Call, transport_errors
from pandastack.sdk._http import HTTP, AsyncHTTP


# Module functions, not methods: a generator stored on the object it is a method of makes a
# reference cycle, so a stream dropped half read was closed only by the cyclic GC, at any
# moment, once inside httpcore's pool lock: closing the response needs that lock, and the
# client deadlocked (seen in bench/hostile.py). Without the cycle it closes when dropped.
def _chunks_then_close(chunks: Iterator[bytes], stack: contextlib.ExitStack,
                       label: str) -> Generator[bytes, None, None]:
    try:
        with transport_errors(label):
            yield from chunks
    finally:
        stack.close()


async def _achunks_then_close(chunks: AsyncIterator[bytes], stack: contextlib.AsyncExitStack,
                              label: str) -> AsyncGenerator[bytes, None]:
    try:
        with transport_errors(label):
            async for chunk in chunks:
                yield chunk
    finally:
        await stack.aclose()


class ByteStream:
    """A file's bytes as they arrive (`read(path, format="stream")`): iterate it; the
    connection closes at the end, on `close()`, or leaving its `with`."""

    def __init__(self, http: HTTP, call: Call[Any]) -> None:
        self._label = call.label
        self._stack = contextlib.ExitStack()
        response = self._stack.enter_context(http.stream(call))  # 404 & co. raise here
        self._gen = _chunks_then_close(response.iter_bytes(), self._stack, self._label)

    def __iter__(self) -> ByteStream:
        return self

    def __next__(self) -> bytes:
        return next(self._gen)

    def close(self) -> None:
        self._gen.close()
        self._stack.close()

    def __enter__(self) -> ByteStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncByteStream:
    """A file's bytes as they arrive, async (`await read(path, format="stream")`)."""

    def __init__(self) -> None:
        self._stack = contextlib.AsyncExitStack()
        self._chunks: AsyncIterator[bytes] | None = None
        self._gen: AsyncGenerator[bytes, None] | None = None
        self._label = ""

    @classmethod
    async def open(cls, http: AsyncHTTP, call: Call[Any]) -> AsyncByteStream:
        stream = cls()
        stream._label = call.label
        response = await stream._stack.enter_async_context(http.stream(call))
        stream._chunks = response.aiter_bytes()
        return stream

    def __aiter__(self) -> AsyncByteStream:
        return self

    async def __anext__(self) -> bytes:
        if self._gen is None:
            assert self._chunks is not None
            self._gen = _achunks_then_close(self._chunks, self._stack, self._label)
        return await anext(self._gen)

    async def aclose(self) -> None:
        if self._gen is not None:
            await self._gen.aclose()
        await self._stack.aclose()

    async def __aenter__(self) -> AsyncByteStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
