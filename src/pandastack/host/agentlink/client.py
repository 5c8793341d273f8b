"""Async client of the in-guest agent (protocol: spec/guest-protocol.md): processes, files
(files.py) and the code interpreter (code.py) over one connection (channel.py, where the
bounds on what the guest can make the host hold are)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from pandastack.guestproto.ops import STDIN_MAX_BYTES, check_request
from pandastack.host.agentlink.channel import Op
from pandastack.host.agentlink.code import CodeMethods
from pandastack.host.agentlink.files import FileOps
from pandastack.host.agentlink.handshake import InitParams
from pandastack.host.agentlink.metrics import MetricsOps
from pandastack.host.agentlink.pty import PtyOps
from pandastack.host.agentlink.volumes import VolumeOps
from pandastack.host.agentlink.watch import WatchOps
from pandastack.hostport.errors import AgentLimitError
from pandastack.hostport.results import CodeEvent as CodeEvent  # re-exported
from pandastack.hostport.results import ExecResult
from pandastack.rules import DEFAULT_EXEC_OUTPUT_MB

OutputCallback = Callable[[bytes], Awaitable[None] | None]
PidCallback = Callable[[int], Awaitable[None] | None]
"""Told a process's pid as soon as it started, before its output."""
DroppedCallback = Callable[[int, int], Awaitable[None] | None]
"""Told, before an attach's backlog, how many bytes of stdout and of stderr the guest's
rings had already dropped (0, 0: the backlog is everything the process wrote)."""

DEFAULT_MAX_OUTPUT = DEFAULT_EXEC_OUTPUT_MB << 20
MAX_PROCS = 10_000
"""Entries of one ``procs`` listing (the agent keeps running ones and the last 64 ended)."""


def exit_code_of(procs: list[dict[str, object]], pid: int) -> int | None:
    """The exit code of background process `pid` in a `procs()` listing: None while it runs
    (or is not listed), -1 if it ended without one (killed by a signal)."""
    for proc in procs:
        if proc.get("pid") == pid and not proc.get("running"):
            code = proc.get("exit_code")
            return code if isinstance(code, int) else -1
    return None


# code.py: run_code, code contexts; watch.py: file watching; pty.py: terminals
class AgentClient(FileOps, CodeMethods, MetricsOps, VolumeOps, WatchOps, PtyOps):
    # -- basic operations -----------------------------------------------------------------
    async def init(self, *, time_ns: int, entropy: bytes, hostname: str, machine_id: str) -> None:
        """Set clock, RNG seed, hostname and machine-id in the guest (after a restore)."""
        params = InitParams(time_ns, entropy, hostname, machine_id)
        await self._call("init", params.entropy, **params.fields())

    async def sync(self) -> None:
        await self._call("sync")

    # -- processes ------------------------------------------------------------------------
    @staticmethod
    def _cmd_fields(
        cmd: str | Sequence[str], env: Mapping[str, str] | None, cwd: str | None,
        user: str | None = None,
    ) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        if isinstance(cmd, str):
            fields["cmd"] = cmd
        else:
            argv = list(cmd)
            if not argv or not all(isinstance(a, str) for a in argv):
                raise ValueError("argv must be a non-empty sequence of str")
            fields["argv"] = argv
        if env is not None:
            fields["env"] = dict(env)
        if cwd is not None:
            fields["cwd"] = cwd
        if user is not None:
            fields["user"] = user
        return fields

    @classmethod
    def _spawn_fields(
        cls, cmd: str | Sequence[str], env: Mapping[str, str] | None, cwd: str | None,
        user: str | None, timeout: float | None,
    ) -> dict[str, Any]:
        """A background process's fields: its timeout (the agent kills its tree then) in ms."""
        fields = cls._cmd_fields(cmd, env, cwd, user)
        if timeout is not None:
            fields["timeout_ms"] = max(1, math.ceil(timeout * 1000))
        return fields

    async def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
        user: str | None = None,
    ) -> ExecResult:
        """Run ``cmd`` (str: via /bin/sh -c; sequence: argv) and wait for it.

        With ``timeout`` the agent kills the whole process tree when it expires
        (``timed_out=True``); this call then waits at most ``timeout + op_timeout``.
        Without one, the call waits as long as the process runs (it still fails at once
        if the channel breaks). ``user`` (a name or uid, optionally ``:group`` or ``:gid``,
        as a Dockerfile's USER) runs it as that user, with its groups, HOME, USER and LOGNAME
        (GuestOSError EINVAL for an unknown name; spec/guest-protocol.md, exec).
        """
        header: dict[str, Any] = {"t": "exec", **self._cmd_fields(cmd, env, cwd, user)}
        if timeout is not None:
            header["timeout_ms"] = max(1, math.ceil(timeout * 1000))
        if stdin is not None:
            header["stdin"] = True
        deadline = None if timeout is None else time.monotonic() + timeout + self.op_timeout
        check_request("exec", {k: v for k, v in header.items() if k != "t"})
        feeder: asyncio.Task[int] | None = None
        with self._operation("exec") as op:
            header["id"] = op.id
            try:
                await self._send(header)
                if stdin is not None:
                    feeder = asyncio.create_task(
                        self._send_stream(op, stdin, "stdin", "stdin_eof", credit_timeout=None)
                    )
                result = await self._collect(op, deadline, on_stdout, on_stderr, max_output)
                op.finished = True
                return result
            finally:
                if feeder is not None:
                    feeder.cancel()
                    with contextlib.suppress(BaseException):
                        await feeder

    async def _collect(
        self,
        op: Op,
        deadline: float | None,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
        max_output: int,
        on_dropped: DroppedCallback | None = None,
    ) -> ExecResult:
        bufs = {"stdout": bytearray(), "stderr": bytearray()}
        cbs = {"stdout": on_stdout, "stderr": on_stderr}
        truncated = False
        while True:
            f = await self._next(op, None if deadline is None else deadline - time.monotonic())
            if f.t == "replay" and op.kind == "attach":
                counts = (self._field(f, "stdout_dropped", int),
                          self._field(f, "stderr_dropped", int))
                if any(isinstance(n, bool) or n < 0 for n in counts):
                    raise self._protocol_error("replay frame: a count that is not one")
                if on_dropped is not None:
                    r = on_dropped(*counts)
                    if inspect.isawaitable(r):
                        await r
            elif f.t in ("stdout", "stderr"):
                buf = bufs[f.t]
                room = max_output - len(buf)
                if room >= len(f.payload):
                    buf += f.payload
                else:
                    buf += f.payload[: max(room, 0)]
                    truncated = True
                cb = cbs[f.t]
                if cb is not None:
                    r = cb(f.payload)
                    if inspect.isawaitable(r):
                        await r
                await self._consumed(op, len(f.payload))
            elif f.t == "exit":
                sig = f.header.get("signal")
                if sig is not None and (not isinstance(sig, int) or isinstance(sig, bool)):
                    raise self._protocol_error("exit frame: bad 'signal'")
                return ExecResult(
                    exit_code=self._field(f, "code", int),
                    stdout=bytes(bufs["stdout"]),
                    stderr=bytes(bufs["stderr"]),
                    duration_ms=float(self._field(f, "duration_ms", (int, float))),
                    timed_out=self._field(f, "timed_out", bool),
                    signal=sig,
                    truncated=truncated,
                )
            else:
                raise self._protocol_error(f"{op.kind}: unexpected {f.t!r} frame")

    async def spawn(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout: float | None = None,
    ) -> int:
        """Start a background process (stdin open for ``send_stdin``); returns its pid.
        With ``timeout`` the agent kills its tree after that long (its exit: timed_out)."""
        fields = self._spawn_fields(cmd, env, cwd, user, timeout)
        f = await self._call("spawn", stdin=True, **fields)
        pid: int = self._field(f, "pid", int)
        return pid

    async def spawn_attach(
        self,
        cmd: str | Sequence[str],
        *,
        on_spawned: PidCallback,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout: float | None = None,
        stdin: bool = True,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> ExecResult:
        """`spawn`, then `attach` to it, in one guest round trip: ``on_spawned`` hears the
        pid before any output. The process is a background one (pid calls reach it; leaving
        this call only detaches); ``stdin=False`` gives it none. ``timeout`` as spawn's."""
        fields = self._spawn_fields(cmd, env, cwd, user, timeout)
        with self._operation("spawn_attach") as op:
            await self._request(op, {"stdin": stdin, **fields})
            # the start is as quick as a spawn's: bounded like one; the output is not
            f = await self._next(op, self.op_timeout)
            if f.t != "attached":
                raise self._protocol_error(f"spawn_attach: expected 'attached', got {f.t!r}")
            told = on_spawned(self._field(f, "pid", int))
            if inspect.isawaitable(told):
                await told
            result = await self._collect(op, None, on_stdout, on_stderr, max_output)
            op.finished = True
            return result

    async def attach(
        self,
        pid: int,
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
        timeout: float | None = None,
        on_dropped: DroppedCallback | None = None,
    ) -> ExecResult:
        """Stream a managed process's buffered and future output, then its exit ("wait").

        ``timeout`` (default: none) bounds the wait; on expiry the process keeps running
        and AgentConnectionError is raised. ``on_dropped`` hears what the rings lost before
        the backlog (an older agent does not say: then it is not called).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._operation("attach") as op:
            await self._request(op, {"pid": pid})
            result = await self._collect(op, deadline, on_stdout, on_stderr, max_output,
                                         on_dropped)
            op.finished = True
            return result

    async def procs(self) -> list[dict[str, object]]:
        f = await self._call("procs")
        items = self._json_list(f, "procs")
        if len(items) > MAX_PROCS:
            raise AgentLimitError(f"procs: the agent listed {len(items)} processes, more than "
                                  f"the {MAX_PROCS} the host accepts")
        if not all(isinstance(i, dict) for i in items):
            raise self._protocol_error("proc_list payload is not a JSON list of objects")
        return items

    async def signal(self, pid: int, sig: int) -> None:
        """Send ``sig`` to a managed process's whole process group (or to ``pid``)."""
        await self._call("signal", pid=pid, sig=int(sig))

    async def send_stdin(self, pid: int, data: bytes, *, eof: bool = False) -> None:
        for i in range(0, len(data), STDIN_MAX_BYTES):
            await self._call("stdin", bytes(data[i : i + STDIN_MAX_BYTES]), pid=pid)
        if eof:
            await self._call("stdin_eof", pid=pid)
