"""Terminals over the guest-agent channel: `pty` starts one, `pty_attach` is a long-lived
operation carrying its output one way and keystrokes and resizes the other
(spec/guest-protocol.md, "pty")."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from pandastack.guestproto import frames as P
from pandastack.host.agentlink.channel import AgentChannel, Op
from pandastack.hostport.pty import PtyExit, check_dims


class AgentPty:
    """One attachment (a `hostport.pty.PtySession`)."""

    def __init__(self, chan: AgentChannel, op: Op, pid: int) -> None:
        self._chan = chan
        self._op = op
        self._pid = pid
        self._closed = False
        self._exited = False
        self._send_lock = asyncio.Lock()

    @property
    def pid(self) -> int:
        return self._pid

    async def receive(self) -> bytes | PtyExit:
        if self._exited:
            raise EOFError("the terminal's process has exited")
        f = await self._chan._next(self._op, None)
        if f.t == "stdout":
            await self._chan._consumed(self._op, len(f.payload))
            return f.payload
        if f.t == "exit":
            self._exited = True
            sig = f.header.get("signal")
            return PtyExit(self._chan._field(f, "code", int),
                           sig if isinstance(sig, int) and not isinstance(sig, bool) else None)
        raise self._chan._protocol_error(f"pty_attach: unexpected {f.t!r} frame")

    async def send(self, data: bytes) -> None:
        """Keystrokes, within the op's credit (the agent grants as it writes them to the
        terminal: a shell that does not read blocks the sender, not the host's memory)."""
        op = self._op
        async with self._send_lock:
            view = memoryview(data)
            while view:
                while op.send_credit <= 0:
                    if op.ended or self._closed:
                        return
                    op.wake.clear()
                    await op.wake.wait()
                if op.ended or self._closed:
                    return
                n = min(len(view), P.MAX_CHUNK, op.send_credit)
                op.send_credit -= n
                await self._chan._send({"t": "stdin", "id": op.id}, bytes(view[:n]))
                view = view[n:]

    async def resize(self, cols: int, rows: int) -> None:
        check_dims(cols, rows)
        if not (self._op.ended or self._closed):
            await self._chan._send({"t": "resize", "id": self._op.id, "cols": cols,
                                    "rows": rows})

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._op.wake.set()
        self._chan._forget(self._op, cancel=not self._op.ended)


class PtyOps(AgentChannel):
    async def pty_create(self, *, cols: int, rows: int, cmd: str | Sequence[str] | None = None,
                         env: Mapping[str, str] | None = None, cwd: str | None = None,
                         user: str | None = None) -> int:
        """Start a process on a new terminal of `cols` x `rows` (the user's shell without
        `cmd`); its pid."""
        check_dims(cols, rows)
        fields: dict[str, Any] = {"cols": cols, "rows": rows}
        if isinstance(cmd, str):
            fields["cmd"] = cmd
        elif cmd is not None:
            argv = list(cmd)
            if not argv or not all(isinstance(a, str) for a in argv):
                raise ValueError("argv must be a non-empty sequence of str")
            fields["argv"] = argv
        for key, value in (("env", None if env is None else dict(env)), ("cwd", cwd),
                           ("user", user)):
            if value is not None:
                fields[key] = value
        f = await self._call("pty", **fields)
        pid: int = self._field(f, "pid", int)
        return pid

    async def pty_connect(self, pid: int) -> AgentPty:
        """Attach to terminal `pid`: GuestOSError ESRCH if there is none, EINVAL if that
        process has no terminal."""
        op = self._register("pty_attach")
        try:
            await self._request(op, {"pid": pid})
            f = await self._next(op, self.op_timeout)
            if f.t != "attached":
                raise self._protocol_error(f"pty_attach: expected 'attached', got {f.t!r}")
        except BaseException:
            self._forget(op, cancel=not op.ended)
            raise
        return AgentPty(self, op, pid)

