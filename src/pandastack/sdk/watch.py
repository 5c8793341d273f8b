"""`sbx.filesystem.watch(path)`: a live file watch, `Watch` and its async twin `AsyncWatch`.

A watch is one open event stream. It is set up in the guest before `watch()` returns, so a
change made after that call is seen. Iterate it for `FileEvent`s, in the order the guest saw
them; the iteration ends after `stop()`, when the watched directory goes away, or after an
``"overflow"`` event (the reader was too slow and events were lost: list the directory again
and start a new watch). Streamed reads of a file are in `byte_streams.py`.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import AsyncIterator, Iterator

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
