"""Contexts backed by one long-lived process with piped stdio (`ProcessContext`) and the bash
context on top of it."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import secrets
import shlex
import signal
import time
from collections.abc import Awaitable, Callable

from . import protocol
from .protocol import INTERRUPT_GRACE, READ_SIZE, SLICE, Context, Run

# --- bash ----------------------------------------------------------------------------------


def _group_members(pgid: int) -> list[int]:
    """Processes in process group `pgid` other than its leader."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == pgid:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def _marker_prefix(buf: bytes | bytearray, marker: bytes) -> int:
    """Length of the longest end of `buf` that is a start of `marker`."""
    for k in range(min(len(marker) - 1, len(buf)), 0, -1):
        if buf.endswith(marker[:k]):
            return k
    return 0


class ProcessContext(Context):
    """A context backed by one long-lived interpreter process with piped stdin/out/err."""

    def __init__(self, ctx_id: str, cwd: str) -> None:
        super().__init__(ctx_id, cwd)
        self.proc: asyncio.subprocess.Process | None = None
        self.queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue(64)
        self.active = False
        self.pumps: list[asyncio.Task[None]] = []

    def argv(self) -> list[str]:
        raise NotImplementedError

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv(), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, cwd=self.cwd, start_new_session=True)
        self.queue = asyncio.Queue(64)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.pumps = [asyncio.create_task(self._pump("stdout", self.proc.stdout)),
                      asyncio.create_task(self._pump("stderr", self.proc.stderr))]

    async def _pump(self, name: str, stream: asyncio.StreamReader) -> None:
        # Always reading: between runs output of background jobs is dropped instead of
        # filling the pipe and blocking them.
        while True:
            data = await stream.read(READ_SIZE)
            if self.active or not data:
                await self.queue.put((name, data))
            if not data:
                return

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        for task in self.pumps:
            task.cancel()
        self.pumps = []
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await proc.wait()

    async def _ensure(self) -> asyncio.subprocess.Process:
        if self.proc is None or self.proc.returncode is not None:
            await self.stop()
            await self.start()
        assert self.proc is not None
        return self.proc

    def _drop_queued(self) -> None:
        while not self.queue.empty():
            self.queue.get_nowait()

    async def _exchange(self, proc: asyncio.subprocess.Process, request: bytes,
                        collect: Callable[[], Awaitable[tuple[int | None, str | None]]],
                        ) -> tuple[int | None, str | None]:
        """Send one request to the process and collect the run's answer with `collect`;
        (None, None) if the process went away. Output belongs to the run only meanwhile:
        what a pump queued before or after is not its own."""
        assert proc.stdin is not None
        self.active = True
        self._drop_queued()
        try:
            proc.stdin.write(request)
            await proc.stdin.drain()
            return await collect()
        except (ConnectionError, OSError):
            return None, None
        finally:
            self.active = False
            self._drop_queued()

    async def _next(self) -> tuple[str, bytes] | None:
        try:
            async with asyncio.timeout(SLICE):
                return await self.queue.get()
        except TimeoutError:
            return None


class BashContext(ProcessContext):
    language = "bash"

    def argv(self) -> list[str]:
        return ["bash", "--noprofile", "--norc"]

    async def execute(self, code: str, run: Run, env: dict[str, str] | None,
                      store_history: bool) -> int | None:
        proc = await self._ensure()
        assert proc.stdin is not None
        self.count += 1
        os.makedirs(protocol.RUN_DIR, mode=0o700, exist_ok=True)
        script = os.path.join(protocol.RUN_DIR, f"{self.id}.sh")
        with open(script, "w", encoding="utf-8") as f:
            f.write(code if code.endswith("\n") else code + "\n")
        marker = f"__pandastack_done_{secrets.token_hex(8)}__"
        pre = post = ""
        if env:
            names = " ".join(sorted(env))
            pre = (f"__pandastack_env=\"$(declare -p {names} 2>/dev/null)\"; export "
                   + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())) + "; ")
            post = f"unset {names}; eval \"$__pandastack_env\"; unset __pandastack_env; "
        # stdin of the sourced code is /dev/null: it must not eat the commands that follow.
        line = (f"{pre}source {shlex.quote(script)} </dev/null; __pandastack_rc=$?; {post}"
                f"printf '%s%d\\n' {marker} \"$__pandastack_rc\"; printf '%s\\n' {marker} >&2\n")
        rc, reason = await self._exchange(
            proc, line.encode(), lambda: self._collect(marker.encode(), proc, run))
        if reason is not None:
            if rc is None:
                await self.stop()
                await run.stopped(reason, "; the shell did not stop and was restarted: its "
                                  "state is lost")
            else:
                await run.stopped(reason, "; the running commands were killed, the shell "
                                  "keeps its state")
        elif rc is None:
            code_ = await self._exit_status(proc)
            await self.stop()
            await run.out.error("ExitError", f"the shell exited (status {code_}); a new shell "
                                "starts with the next run: its state is lost")
        elif rc != 0:
            await run.out.error("ExitError", f"exit status {rc}")
        return self.count

    @staticmethod
    async def _exit_status(proc: asyncio.subprocess.Process) -> int | None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2):
                return await proc.wait()
        return None

    async def _collect(self, marker: bytes, proc: asyncio.subprocess.Process,
                       run: Run) -> tuple[int | None, str | None]:
        """Relay output until both streams showed the marker; (exit status, stop reason)."""
        bufs = {"stdout": bytearray(), "stderr": bytearray()}
        decoders = {n: codecs.getincrementaldecoder("utf-8")("replace") for n in bufs}
        done: dict[str, bool] = {"stdout": False, "stderr": False}
        rc: int | None = None
        reason: str | None = None
        stopped_at = 0.0
        while not all(done.values()):
            if reason is None:
                reason = run.stop_reason()
                if reason is not None:
                    stopped_at = time.monotonic()
                    for pid in _group_members(proc.pid):
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
            elif time.monotonic() - stopped_at > min(INTERRUPT_GRACE, 3.0):
                return None, reason
            item = await self._next()
            if item is None:
                continue
            name, data = item
            if not data:
                return None, reason  # the shell itself is gone
            if done[name]:
                continue
            buf = bufs[name]
            buf += data
            at = buf.find(marker)
            if at < 0:
                keep = _marker_prefix(buf, marker)  # a marker may be split across reads
                text, rest = bytes(buf[:len(buf) - keep]), bytes(buf[len(buf) - keep:])
            else:
                tail = bytes(buf[at + len(marker):])
                if b"\n" not in tail:
                    continue
                if name == "stdout":
                    digits = tail.split(b"\n", 1)[0]
                    rc = int(digits) if digits.isdigit() else 1
                text, rest = bytes(buf[:at]), b""
                done[name] = True
            bufs[name] = bytearray(rest)
            await run.out.text(name, decoders[name].decode(text, final=done[name]))
        return rc, reason
