"""`RemoteSandbox`: one sandbox of an agent, as the host port's `SandboxPort`. Its `state`
and `is_alive()` are what the lookup that made it said; every operation is a call."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence

from pandastack.hostport.frames import Kind
from pandastack.hostport.protocols import DroppedCallback, OutputCallback
from pandastack.hostport.results import CodeEvent, ExecResult, FileInfo, GuestMetrics
from pandastack.hostport.watch import WatchBatch, WatchEvent
from pandastack.hostport.wire import (
    CodeContext,
    CodeContextList,
    CodeContextRequest,
    CodeEventModel,
    DirList,
    ExecDone,
    ExecRequest,
    FileInfoModel,
    GuestMetricsModel,
    MkdirRequest,
    ProcessList,
    PtyRequest,
    RenameRequest,
    Replay,
    RunCodeRequest,
    SandboxInfo,
    SignalRequest,
    Spawned,
    SpawnRequest,
    StdinRequest,
    Written,
)
from pandastack.rules import DEFAULT_EXEC_OUTPUT_MB

from .calls import Caller, FrameStream, api_path, parse
from .pty import RemotePty, connect_pty

# What an ExecResult keeps of each stream when the caller says nothing, as the guest-agent
# client does in process (host/agentlink/client.py DEFAULT_MAX_OUTPUT).
MAX_OUTPUT = DEFAULT_EXEC_OUTPUT_MB << 20
# How long past an exec's own timeout its answer may take: the guest-agent client waits
# `timeout + agent_timeout_s` (30 s by default) before it gives up itself.
EXEC_GRACE = 120.0


class _Output:
    """An exec's output as it arrives: handed to the callbacks frame by frame (each awaited
    before the next frame is read: that is the backpressure) and kept for the result."""

    def __init__(self, on_stdout: OutputCallback | None, on_stderr: OutputCallback | None,
                 on_dropped: DroppedCallback | None = None, keep: int = MAX_OUTPUT):
        self.callbacks = {Kind.STDOUT: on_stdout, Kind.STDERR: on_stderr}
        self.kept = {Kind.STDOUT: bytearray(), Kind.STDERR: bytearray()}
        self.truncated = False
        self.on_dropped = on_dropped
        self.keep = keep

    async def read(self, frames: FrameStream, address: str = "") -> None:
        async for frame in frames:
            if frame.kind == Kind.REPLAY and self.on_dropped is not None:
                replay = parse(Replay, frame.payload, address)
                told = self.on_dropped(replay.stdout_dropped, replay.stderr_dropped)
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
        read = None if timeout is None else timeout + EXEC_GRACE
        async with self._caller.stream("POST", self._path("exec"), json=body,
                                       read=read) as frames:
            await output.read(frames)
        return output.result(frames, self._caller.address)

    async def spawn(self, cmd: str | Sequence[str], *, env: Mapping[str, str] | None = None,
                    cwd: str | None = None, user: str | None = None,
                    timeout: float | None = None) -> int:
        body = SpawnRequest(cmd=cmd if isinstance(cmd, str) else list(cmd),
                            env=dict(env) if env is not None else None, cwd=cwd, user=user,
                            timeout=timeout)
        spawned = await self._caller.model(Spawned, "POST", self._path("processes"),
                                           json=body, read=self._guest)
        return spawned.pid

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

    async def procs(self) -> list[dict[str, object]]:
        listed = await self._caller.model(ProcessList, "GET", self._path("processes"),
                                          read=self._guest)
        return listed.processes

    async def signal(self, pid: int, sig: int) -> None:
        await self._caller.call("POST", self._path("processes", pid, "signal"),
                                json=SignalRequest(signal=int(sig)), read=self._guest)

    async def send_stdin(self, pid: int, data: bytes, *, eof: bool = False) -> None:
        await self._caller.call("POST", self._path("processes", pid, "stdin"),
                                json=StdinRequest(data=data, eof=eof), read=self._guest)

    async def pty_create(self, *, cols: int, rows: int, cmd: str | Sequence[str] | None = None,
                         env: Mapping[str, str] | None = None, cwd: str | None = None,
                         user: str | None = None) -> int:
        body = PtyRequest(cols=cols, rows=rows,
                          cmd=cmd if cmd is None or isinstance(cmd, str) else list(cmd),
                          env=dict(env) if env is not None else None, cwd=cwd, user=user)
        spawned = await self._caller.model(Spawned, "POST", self._path("pty"), json=body,
                                           read=self._guest)
        return spawned.pid

    async def pty_connect(self, pid: int) -> RemotePty:
        return await connect_pty(self._caller.address, self._caller.token, self.id, pid,
                                 self._guest)

    # -- files ------------------------------------------------------------------------------

    async def read_file(self, path: str) -> AsyncIterator[bytes]:
        async with self._caller.stream("GET", self._path("files", "content"),
                                       params={"path": path}, read=self._guest) as frames:
            async for frame in frames:
                if frame.kind is Kind.DATA:
                    yield frame.payload

    async def write_file(self, path: str, data: bytes | AsyncIterable[bytes], *,
                         mode: int = 0o644) -> int:
        written = await self._caller.model(
            Written, "PUT", self._path("files", "content"), params={"path": path, "mode": mode},
            content=data, read=self._guest)
        return written.size

    async def list_dir(self, path: str) -> list[FileInfo]:
        listed = await self._caller.model(DirList, "GET", self._path("files"),
                                          params={"path": path}, read=self._guest)
        return [entry.value() for entry in listed.entries]

    async def stat(self, path: str) -> FileInfo:
        info = await self._caller.model(FileInfoModel, "GET", self._path("files", "stat"),
                                        params={"path": path}, read=self._guest)
        return info.value()

    async def mkdir(self, path: str, *, parents: bool = True) -> None:
        await self._caller.call("POST", self._path("files", "mkdir"),
                                json=MkdirRequest(path=path, parents=parents), read=self._guest)

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        await self._caller.call("DELETE", self._path("files"),
                                params={"path": path, "recursive": recursive}, read=self._guest)

    async def rename(self, src: str, dst: str) -> None:
        await self._caller.call("POST", self._path("files", "rename"),
                                json=RenameRequest(src=src, dst=dst), read=self._guest)

    async def watch(self, path: str, *,
                    recursive: bool = True) -> AsyncIterator[list[WatchEvent]]:
        address = self._caller.address
        async with self._caller.stream("GET", self._path("files", "watch"),
                                       params={"path": path, "recursive": recursive},
                                       read=None) as frames:
            async for frame in frames:
                if frame.kind is Kind.EVENT:
                    yield [e.event() for e in parse(WatchBatch, frame.payload, address).events]

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
                    yield parse(CodeEventModel, frame.payload, address).event()

    async def create_code_context(self, language: str = "python",
                                  cwd: str | None = None) -> dict[str, object]:
        made = await self._caller.model(CodeContext, "POST", self._path("code", "contexts"),
                                        json=CodeContextRequest(language=language, cwd=cwd),
                                        read=self._caller.timeouts.lifecycle)
        return made.context

    async def list_code_contexts(self) -> list[dict[str, object]]:
        listed = await self._caller.model(CodeContextList, "GET",
                                          self._path("code", "contexts"),
                                          read=self._caller.timeouts.lifecycle)
        return listed.contexts

    async def delete_code_context(self, context_id: str) -> None:
        await self._caller.call("DELETE", self._path("code", "contexts", context_id),
                                read=self._caller.timeouts.lifecycle)

    async def restart_code_context(self, context_id: str) -> None:
        await self._caller.call("POST", self._path("code", "contexts", context_id, "restart"),
                                read=self._caller.timeouts.lifecycle)

    # -- metrics ----------------------------------------------------------------------------

    async def metrics(self, window_ms: int = 200) -> GuestMetrics:
        measured = await self._caller.model(GuestMetricsModel, "GET", self._path("metrics"),
                                            params={"window_ms": window_ms}, read=self._guest)
        return measured.value()
