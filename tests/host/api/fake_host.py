"""A host port in memory for the host API's own tests, and a real uvicorn serving the host
app over it on a unix socket in this event loop (the same server the agent process runs).

Its sandboxes' operations are scripted by the test: `FakeSandbox.script` maps a command to
a coroutine that plays the guest (writes output, waits on the test, fails)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, cast

import uvicorn

from pandastack.cli.agent import listening_socket
from pandastack.host.api import create_host_app
from pandastack.hostport.errors import SandboxNotFound
from pandastack.hostport.protocols import OutputCallback, RuntimePort
from pandastack.hostport.results import ExecResult

Emit = Callable[[bytes], Awaitable[None]]
Script = Callable[[Emit, Emit], Awaitable[int]]


async def call(callback: OutputCallback | None, data: bytes) -> None:
    if callback is not None:
        result = callback(data)
        if isinstance(result, Awaitable):
            await result


class FakeSandbox:
    def __init__(self, sandbox_id: str) -> None:
        self.id = sandbox_id
        self.state = "running"
        self.forked_from: str | None = None
        self.script: dict[str, Script] = {}
        self.files: dict[str, bytes] = {}
        self.chunks_seen: list[int] = []
        self.file_reads: dict[str, Callable[[], AsyncIterator[bytes]]] = {}
        self.on_chunk: Callable[[int], None] = lambda _n: None

    def is_alive(self) -> bool:
        return True

    async def exec(self, cmd: str | Sequence[str], *, on_stdout: OutputCallback | None = None,
                   on_stderr: OutputCallback | None = None, **_: object) -> ExecResult:
        out, err = bytearray(), bytearray()

        async def stdout(data: bytes) -> None:
            out.extend(data)
            await call(on_stdout, data)

        async def stderr(data: bytes) -> None:
            err.extend(data)
            await call(on_stderr, data)

        code = await self.script[str(cmd)](stdout, stderr)
        return ExecResult(code, bytes(out), bytes(err), 1.0, False, None, False)

    async def read_file(self, path: str) -> AsyncIterator[bytes]:
        if path in self.file_reads:
            async for chunk in self.file_reads[path]():
                yield chunk
            return
        data = self.files[path]
        for start in range(0, len(data), 65536):
            yield data[start:start + 65536]

    async def write_file(self, path: str, data: bytes | AsyncIterable[bytes], *,
                         mode: int = 0o644) -> int:
        if isinstance(data, bytes):
            self.files[path] = data
            return len(data)
        got = bytearray()
        async for chunk in data:
            got += chunk
            self.chunks_seen.append(len(chunk))
            self.on_chunk(len(got))
        self.files[path] = bytes(got)
        return len(got)


class FakeHost:
    """Only what the tests call; `fail[op]` makes that operation raise."""

    def __init__(self) -> None:
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.fail: dict[str, BaseException] = {}
        self.stall = asyncio.Event()
        self.stalling = False

    def add(self, sandbox_id: str = "sbx-1") -> FakeSandbox:
        self.sandboxes[sandbox_id] = FakeSandbox(sandbox_id)
        return self.sandboxes[sandbox_id]

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def get(self, sandbox_id: str) -> FakeSandbox:
        if self.stalling:
            await self.stall.wait()
        if sandbox_id not in self.sandboxes:
            raise SandboxNotFound(f"no sandbox {sandbox_id}")
        return self.sandboxes[sandbox_id]

    async def list_sandboxes(self) -> list[FakeSandbox]:
        return list(self.sandboxes.values())

    async def kill(self, sandbox_id: str) -> None:
        if "kill" in self.fail:
            raise self.fail["kill"]
        await self.get(sandbox_id)
        del self.sandboxes[sandbox_id]

    async def console_log(self, sandbox_id: str, max_bytes: int) -> bytes:
        await self.get(sandbox_id)
        return b"\x00boot\xff"[-max_bytes:] if max_bytes else b""


@contextlib.asynccontextmanager
async def served(host: FakeHost | Any, token: str, directory: Path) -> AsyncIterator[str]:
    """The host app over `host` on a real uvicorn (as `pandastack agent` runs it) at a unix
    socket in `directory`; yields its address."""
    path = directory / "agent.sock"
    sock = listening_socket(f"unix:{path}")
    app = create_host_app(cast(RuntimePort, host), token)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                           timeout_graceful_shutdown=1))
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield f"unix:{path}"
    finally:
        server.should_exit = True
        await task
        sock.close()
