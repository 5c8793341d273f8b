"""`sbx.filesystem.watch(path)`: a live file watch, `Watch` and its async twin `AsyncWatch`.

A watch is one open event stream. It is set up in the guest before `watch()` returns, so a
change made after that call is seen. Iterate it for `FileEvent`s, in the order the guest saw
them; the iteration ends after `stop()`, when the watched directory goes away, or after an
``"overflow"`` event (the reader was too slow and events were lost: list the directory again
and start a new watch). Also: streamed reads of a file (`read(path, format="stream")`).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from typing import Any

import httpx

from pandastack.sdk._base import Call, transport_errors
from pandastack.sdk._http import HTTP, AsyncHTTP
from pandastack.sdk._watch import WatchDecoder
from pandastack.sdk.errors import ProtocolError
from pandastack.wire.sandboxes import FileEvent

__all__ = ["AsyncWatch", "FileEvent", "Watch"]


class Watch:
    """A running file watch: iterate it for `FileEvent`s; `stop()` ends it (also as a
    context manager)."""

    def __init__(self, http: HTTP, call: Call[None]) -> None:
        self._label = call.label
        self._stack = contextlib.ExitStack()
        self._decoder = WatchDecoder()
        self._pending: list[FileEvent] = []
        self._lock = threading.Lock()
        self._stopped = False
        response = self._stack.enter_context(http.stream(call))
        self._network = response.extensions.get("network_stream")
        self._chunks: Iterator[bytes] = response.iter_bytes()
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise

    def _start(self) -> None:
        with transport_errors(self._label):
            for chunk in self._chunks:
                self._pending += self._decoder.feed(chunk)
                if self._decoder.started:
                    return
        raise ProtocolError(f"{self._label}: the stream ended before the watch started")

    @property
    def stopped(self) -> bool:
        """Whether the watch has ended (stopped, overflowed, or its directory is gone)."""
        return self._stopped or self._decoder.done

    def __iter__(self) -> Iterator[FileEvent]:
        try:
            yield from self._take_pending()
            while not self._decoder.done and not self._stopped:
                try:
                    with transport_errors(self._label):
                        chunk = next(self._chunks, None)
                except Exception:
                    if self._stopped:
                        return  # stop() closed the stream under us
                    raise
                if self._stopped:
                    return  # what came after stop() (even an error) is no longer ours
                if chunk is None:
                    self._pending += self._decoder.close()
                    yield from self._take_pending()
                    return
                self._pending += self._decoder.feed(chunk)
                yield from self._take_pending()
        finally:
            if self._decoder.done:
                self.stop()

    def _take_pending(self) -> list[FileEvent]:
        out, self._pending = self._pending, []
        return out

    def stop(self) -> None:
        """End the watch (from any thread): the guest drops it, iteration ends."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        # A read blocked in another thread wakes only when the socket is shut down (closing
        # it is not enough on Linux); then the connection is closed and not reused.
        sock = self._network.get_extra_info("socket") if self._network is not None else None
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(httpx.HTTPError, OSError, RuntimeError):
            self._stack.close()

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class AsyncWatch:
    """A running file watch: iterate it (`async for`) for `FileEvent`s; `stop()` ends it
    (also as an async context manager)."""

    def __init__(self, http: AsyncHTTP, call: Call[None]) -> None:
        self._http = http
        self._call = call
        self._label = call.label
        self._stack = contextlib.AsyncExitStack()
        self._decoder = WatchDecoder()
        self._pending: list[FileEvent] = []
        self._stopped = False
        self._chunks: AsyncIterator[bytes] | None = None

    async def _start(self) -> None:
        """Open the stream and wait for the guest to have set the watch up."""
        try:
            response = await self._stack.enter_async_context(self._http.stream(self._call))
            self._chunks = response.aiter_bytes()
            with transport_errors(self._label):
                async for chunk in self._chunks:
                    self._pending += self._decoder.feed(chunk)
                    if self._decoder.started:
                        return
            raise ProtocolError(f"{self._label}: the stream ended before the watch started")
        except BaseException:
            await self._stack.aclose()
            raise

    @property
    def stopped(self) -> bool:
        """Whether the watch has ended (stopped, overflowed, or its directory is gone)."""
        return self._stopped or self._decoder.done

    def __aiter__(self) -> AsyncIterator[FileEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[FileEvent]:
        assert self._chunks is not None, "AsyncWatch is started by AsyncFilesystem.watch()"
        try:
            for e in self._take_pending():
                yield e
            while not self._decoder.done and not self._stopped:
                try:
                    with transport_errors(self._label):
                        chunk: bytes | None = await anext(self._chunks, None)
                except Exception:
                    if self._stopped:
                        return
                    raise
                if self._stopped:
                    return
                if chunk is None:
                    self._pending += self._decoder.close()
                    for e in self._take_pending():
                        yield e
                    return
                self._pending += self._decoder.feed(chunk)
                for e in self._take_pending():
                    yield e
        finally:
            if self._decoder.done:
                await self.stop()

    def _take_pending(self) -> list[FileEvent]:
        out, self._pending = self._pending, []
        return out

    async def stop(self) -> None:
        """End the watch: the guest drops it, iteration ends."""
        if self._stopped:
            return
        self._stopped = True
        with contextlib.suppress(httpx.HTTPError, OSError, RuntimeError):
            await self._stack.aclose()

    async def __aenter__(self) -> AsyncWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


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
