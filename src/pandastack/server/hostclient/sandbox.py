"""`RemoteSandbox`: one sandbox of an agent, as the host port's `SandboxPort`. Its `state`
and `is_alive()` are what the lookup that made it said; every operation is a call. The
request/response ones are rows of the port's operation table (plain.py); the streamed ones
are written out here."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pandastack.guestproto.ops import WRITE_FILE_MODE
from pandastack.hostport.frames import Kind
from pandastack.hostport.host_api.models import (
    ExecDone,
    ExecRequest,
    Replay,
    RunCodeRequest,
    SandboxInfo,
    SpawnAttachRequest,
    Spawned,
    WatchBatch,
    Written,
)
from pandastack.hostport.protocols import DroppedCallback, OutputCallback, PidCallback
from pandastack.hostport.results import CodeEvent, ExecResult
from pandastack.hostport.watch import WatchEvent
from pandastack.rules import DEFAULT_EXEC_OUTPUT_MB

from .calls import Caller, FrameStream, api_path, parse
from .plain import install
from .pty import RemotePty, connect_pty

# What an ExecResult keeps of each stream when the caller says nothing, as the guest-agent
# client does in process (host/agentlink/client.py DEFAULT_MAX_OUTPUT).
MAX_OUTPUT = DEFAULT_EXEC_OUTPUT_MB << 20
EXEC_ANSWER_GRACE_S = 120.0
"""How long past an exec's own `timeout` this client waits for the agent's answer before it
counts the agent as gone. It covers the host's guest-agent client, which gives up itself
after `timeout + agent_timeout_s` (30 s by default: host/config.py), and that error's way
back, with room for a host slowed by load; it is no limit on the command."""


class _Output:
    """An exec's output as it arrives: handed to the callbacks frame by frame (each awaited
    before the next frame is read: that is the backpressure) and kept for the result."""

    def __init__(self, on_stdout: OutputCallback | None, on_stderr: OutputCallback | None,
                 on_dropped: DroppedCallback | None = None, keep: int = MAX_OUTPUT,
                 on_spawned: PidCallback | None = None):
        self.callbacks = {Kind.STDOUT: on_stdout, Kind.STDERR: on_stderr}
        self.kept = {Kind.STDOUT: bytearray(), Kind.STDERR: bytearray()}
        self.truncated = False
        self.on_dropped = on_dropped
        self.on_spawned = on_spawned
        self.keep = keep

    async def read(self, frames: FrameStream, address: str = "") -> None:
        async for frame in frames:
            told: object = None
            if frame.kind == Kind.REPLAY and self.on_dropped is not None:
                replay = parse(Replay, frame.payload, address)
                told = self.on_dropped(replay.stdout_dropped, replay.stderr_dropped)
            elif frame.kind == Kind.SPAWNED and self.on_spawned is not None:
                told = self.on_spawned(parse(Spawned, frame.payload, address).pid)
            if inspect.isawaitable(told):
                await told
            if frame.kind not in self.kept:
                continue
            kept = self.kept[frame.kind]
            room = self.keep - len(kept)
            kept += frame.payload[:max(room, 0)]
            self.truncated |= room < len(frame.payload)
            callback = self.callbacks[frame.kind]
            if callback is not None:
                result = callback(frame.payload)
                if inspect.isawaitable(result):
                    await result

    def result(self, frames: FrameStream, address: str) -> ExecResult:
        done = parse(ExecDone, frames.result, address)
        return done.value(bytes(self.kept[Kind.STDOUT]), bytes(self.kept[Kind.STDERR]),
                          self.truncated)


class RemoteSandbox:
    if TYPE_CHECKING:
        # The table's methods (plain.install, below), for the type checker.
        def __getattr__(self, name: str) -> Any: ...

    def __init__(self, caller: Caller, info: SandboxInfo) -> None:
        self._caller = caller
        self._info = info

    def __repr__(self) -> str:
        return f"<RemoteSandbox {self.id} {self.state} at {self._caller.address}>"

    @property
    def id(self) -> str:
        return self._info.id

    @property
    def state(self) -> str:
        return self._info.state

    def is_alive(self) -> bool:
        return self._info.alive

    @property
    def forked_from(self) -> str | None:
        return self._info.forked_from

    def _path(self, *parts: str | int) -> str:
        return api_path("sandboxes", self.id, *parts)

    @property
    def _guest(self) -> float:
        return self._caller.timeouts.guest

    # -- processes --------------------------------------------------------------------------

    async def exec(self, cmd: str | Sequence[str], *, timeout: float | None = None,
                   env: Mapping[str, str] | None = None, cwd: str | None = None,
                   stdin: bytes | None = None, on_stdout: OutputCallback | None = None,
                   on_stderr: OutputCallback | None = None,
                   user: str | None = None, max_output: int | None = None) -> ExecResult:
        keep = MAX_OUTPUT if max_output is None else max_output
        body = ExecRequest(cmd=cmd if isinstance(cmd, str) else list(cmd), timeout=timeout,
                           env=dict(env) if env is not None else None, cwd=cwd, stdin=stdin,
                           user=user, max_output=keep)
        output = _Output(on_stdout, on_stderr, keep=keep)
        read = None if timeout is None else timeout + EXEC_ANSWER_GRACE_S
        async with self._caller.stream("POST", self._path("exec"), json=body,
                                       read=read) as frames:
            await output.read(frames)
        return output.result(frames, self._caller.address)

    async def attach(self, pid: int, *, on_stdout: OutputCallback | None = None,
                     on_stderr: OutputCallback | None = None,
                     on_dropped: DroppedCallback | None = None,
                     keep_output: bool = True) -> ExecResult:
        output = _Output(on_stdout, on_stderr, on_dropped, MAX_OUTPUT if keep_output else 0)
        async with self._caller.stream("POST", self._path("processes", pid, "attach"),
                                       params=None if keep_output else {"keep_output": "false"},
                                       read=None) as frames:
            await output.read(frames, self._caller.address)
        return output.result(frames, self._caller.address)

    async def spawn_attach(self, cmd: str | Sequence[str], *, on_spawned: PidCallback,
                           env: Mapping[str, str] | None = None, cwd: str | None = None,
                           user: str | None = None, timeout: float | None = None,
                           stdin: bool = True, on_stdout: OutputCallback | None = None,
                           on_stderr: OutputCallback | None = None,
                           keep_output: bool = True) -> ExecResult:
        body = SpawnAttachRequest(cmd=cmd if isinstance(cmd, str) else list(cmd),
                                  env=dict(env) if env is not None else None, cwd=cwd,
                                  user=user, timeout=timeout, stdin=stdin,
                                  keep_output=keep_output)
        output = _Output(on_stdout, on_stderr, keep=MAX_OUTPUT if keep_output else 0,
                         on_spawned=on_spawned)
        async with self._caller.stream("POST", self._path("processes", "spawn-attach"),
                                       json=body, read=None) as frames:
            await output.read(frames, self._caller.address)
        return output.result(frames, self._caller.address)

    async def pty_connect(self, pid: int) -> RemotePty:
        return await connect_pty(self._caller.address, self._caller.token, self.id, pid,
                                 self._guest, tls=self._caller.tls)

    # -- files ------------------------------------------------------------------------------

    async def read_file(self, path: str) -> AsyncIterator[bytes]:
        async with self._caller.stream("GET", self._path("files", "content"),
                                       params={"path": path}, read=self._guest) as frames:
            async for frame in frames:
                if frame.kind is Kind.DATA:
                    yield frame.payload

    async def write_file(self, path: str, data: bytes | AsyncIterable[bytes], *,
                         mode: int = WRITE_FILE_MODE) -> int:
        written = await self._caller.model(
            Written, "PUT", self._path("files", "content"), params={"path": path, "mode": mode},
            content=data, read=self._guest)
        return written.size

    async def watch(self, path: str, *,
                    recursive: bool = True) -> AsyncIterator[list[WatchEvent]]:
        address = self._caller.address
        async with self._caller.stream("GET", self._path("files", "watch"),
                                       params={"path": path, "recursive": recursive},
                                       read=None) as frames:
            async for frame in frames:
                if frame.kind is Kind.EVENT:
                    yield parse(WatchBatch, frame.payload, address).events

    # -- code interpreter -------------------------------------------------------------------

    async def run_code(self, code: str, *, language: str = "python",
                       context_id: str | None = None, timeout: float | None = None,
                       env: Mapping[str, str] | None = None) -> AsyncIterator[CodeEvent]:
        body = RunCodeRequest(code=code, language=language, context_id=context_id,
                              timeout=timeout, env=dict(env) if env is not None else None)
        address = self._caller.address
        async with self._caller.stream("POST", self._path("code", "run"), json=body,
                                       read=None) as frames:
            async for frame in frames:
                if frame.kind is Kind.EVENT:
                    yield parse(CodeEvent, frame.payload, address)


install(RemoteSandbox, on_sandbox=True)
