"""pandastack code interpreter: persistent code contexts behind a unix socket (runs in the guest).

Installed into images that have a code interpreter as /opt/pandastack/kernel_server.py and run
by /opt/venv/bin/python; the guest agent relays its socket to the host (`code` op,
spec/guest-protocol.md). One request per connection, newline-delimited JSON both ways:

    {"op": "run", "code", "language", "context_id", "timeout", "env", "store_history"}
        -> {"type": "stdout"|"stderr", "text"}, {"type": "result", "data", "is_main_result"},
           {"type": "error", "name", "value", "traceback"}, ..., {"type": "end",
           "execution_count"}
    {"op": "create_context", "language", "cwd"}  -> {"type": "ok", "context": {...}}
    {"op": "list_contexts"}                      -> {"type": "ok", "contexts": [...]}
    {"op": "delete_context" | "restart_context", "id"} -> {"type": "ok"}

A request that cannot be carried out is answered by one {"type": "failure", "code", "message"}
line. Closing the connection during a run interrupts it like a timeout does.

Python contexts are ipykernel kernels driven through jupyter_client; bash and javascript
contexts are one persistent `bash` / `node` process each. Only the standard library is needed
for bash and javascript: jupyter_client is imported when the first python context starts.
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import contextlib
import json
import logging
import os
import re
import secrets
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

SOCKET_PATH = "/run/pandastack/code.sock"
# Scratch files (bash scripts, kernel sockets) live beside the socket: on tmpfs in the guest.
RUN_DIR = "/run/pandastack/code"
DEFAULT_CWD = "/work"
MAX_REQUEST_LINE = 2 << 20
MAX_CONTEXTS = 16
MAX_RUN_OUTPUT = 16 << 20  # characters of stdout+stderr per run; the rest is dropped
MAX_TEXT_EVENT = 256 << 10  # characters per stdout/stderr event
MAX_EVENT_BYTES = 32 << 20  # one encoded event line (a result bundle); bigger ones are dropped
# Results of one run (displays, the last value); the rest is dropped with a note. The host
# has its own, higher bounds (code_client.MAX_RUN_*): these keep an honest run under them.
MAX_RUN_RESULTS = 5000
MAX_RUN_RESULT_BYTES = 48 << 20  # encoded result lines of one run together
MAX_ENV = 256
KERNEL_START_TIMEOUT = 300.0  # ipykernel plus numpy under TCG on a busy host is slow
SLICE = 0.5  # how often a waiting run looks at its deadline, its client and its process
# After an interrupt, how long a kernel or shell gets to stop before it is restarted.
INTERRUPT_GRACE = 15.0
READ_SIZE = 64 << 10
LANGUAGES = ("python", "bash", "javascript")
ALIASES = {"python3": "python", "py": "python", "js": "javascript", "node": "javascript",
           "sh": "bash", "shell": "bash"}
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")

log = logging.getLogger("kernel_server")


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


class Failure(Exception):
    """Answer the request with one `failure` line."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _encode(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


class Output:
    """The event lines of one connection, bounded; once the client is gone, writes are dropped
    and `gone` is set so that a run stops."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.gone = asyncio.Event()
        self.text_chars = 0
        self.truncated = False
        self.results = 0
        self.result_bytes = 0
        self.results_dropped = False

    async def send(self, obj: dict[str, Any]) -> bool:
        return await self._send_line(_encode(obj), obj)

    async def _send_line(self, line: bytes, obj: dict[str, Any]) -> bool:
        if len(line) > MAX_EVENT_BYTES:
            return await self.send({"type": "stderr", "text": (
                f"[pandastack: a {obj.get('type')} of {len(line)} bytes was dropped: over the "
                f"{MAX_EVENT_BYTES >> 20} MiB limit]\n")})
        if self.gone.is_set():
            return False
        try:
            self.writer.write(line)
            await self.writer.drain()
        except (ConnectionError, OSError, RuntimeError):
            self.gone.set()
            return False
        return True

    async def result(self, data: dict[str, str], is_main_result: bool) -> None:
        obj = {"type": "result", "data": data, "is_main_result": is_main_result}
        line = _encode(obj)
        size = len(line)
        if size > MAX_EVENT_BYTES:
            await self._send_line(line, obj)  # dropped there, with its own note
            return
        if (self.results >= MAX_RUN_RESULTS
                or self.result_bytes + size > MAX_RUN_RESULT_BYTES):
            if not self.results_dropped:
                self.results_dropped = True
                await self.send({"type": "stderr", "text": (
                    f"\n[pandastack: further results of this run were dropped: over "
                    f"{MAX_RUN_RESULTS} results or {MAX_RUN_RESULT_BYTES >> 20} MiB]\n")})
            return
        self.results += 1
        self.result_bytes += size
        await self._send_line(line, obj)

    async def text(self, stream: str, text: str) -> None:
        if not text or self.truncated:
            return
        room = MAX_RUN_OUTPUT - self.text_chars
        if len(text) > room:
            text, self.truncated = text[:room], True
        self.text_chars += len(text)
        for i in range(0, len(text), MAX_TEXT_EVENT):
            await self.send({"type": stream, "text": text[i:i + MAX_TEXT_EVENT]})
        if self.truncated:
            await self.send({"type": "stderr", "text": (
                f"\n[pandastack: output truncated after {MAX_RUN_OUTPUT >> 20} Mi characters]\n")})

    async def error(self, name: str, value: str, traceback: str = "") -> None:
        await self.send({"type": "error", "name": name, "value": value,
                         "traceback": strip_ansi(traceback)})


class Run:
    """What one run may be stopped by: its deadline, its client leaving, or its context being
    restarted or deleted (`abort`)."""

    def __init__(self, out: Output, timeout: float | None, abort: asyncio.Event) -> None:
        self.out = out
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.abort = abort

    def stop_reason(self) -> str | None:
        if self.abort.is_set():
            return "aborted"
        if self.out.gone.is_set():
            return "abandoned"
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return "timeout"
        return None

    async def stopped(self, reason: str, detail: str = "", traceback: str = "") -> None:
        """Report why the run ended early (nobody listens to an abandoned run)."""
        if reason == "timeout":
            await self.out.error("TimeoutError",
                                 f"execution timed out after {self.timeout:g} s{detail}",
                                 traceback)
        elif reason == "aborted":
            await self.out.error("ExecutionAborted", "the context was restarted or deleted",
                                 traceback)


class Context:
    language = ""

    def __init__(self, ctx_id: str, cwd: str) -> None:
        self.id = ctx_id
        self.cwd = cwd
        self.lock = asyncio.Lock()
        self.abort = asyncio.Event()
        self.count = 0

    def describe(self) -> dict[str, Any]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def execute(self, code: str, run: Run, env: dict[str, str] | None,
                      store_history: bool) -> int | None:
        """Run `code`, sending its events to `run.out`; returns the execution count."""
        raise NotImplementedError

    async def run(self, code: str, run: Run, env: dict[str, str] | None,
                  store_history: bool) -> int | None:
        async with self.lock:
            return await self.execute(code, run, env, store_history)

    async def _take_over(self) -> None:
        """Take the lock, making a run in progress stop first (it escalates to a restart of
        its process if the interrupt is not honoured)."""
        if self.lock.locked():
            self.abort.set()
        await self.lock.acquire()
        self.abort.clear()

    async def restart(self) -> None:
        await self._take_over()
        try:
            await self.stop()
            await self.start()
        finally:
            self.lock.release()

    async def delete(self) -> None:
        await self._take_over()
        try:
            await self.stop()
        finally:
            self.lock.release()


# --- python --------------------------------------------------------------------------------


def _bundle(data: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for mime, value in data.items():
        if isinstance(value, str):
            # base64 image data may carry line breaks; consumers want the bare payload
            out[mime] = "".join(value.split()) if mime.startswith("image/") and \
                not mime.startswith("image/svg") else value
        else:
            out[mime] = json.dumps(value)
    return out


class PythonContext(Context):
    language = "python"

    def __init__(self, ctx_id: str, cwd: str) -> None:
        super().__init__(ctx_id, cwd)
        self.km: Any = None
        self.kc: Any = None

    async def start(self) -> None:
        from jupyter_client.manager import (  # type: ignore[import-not-found,unused-ignore]
            AsyncKernelManager,
        )

        # Unix sockets (in JUPYTER_RUNTIME_DIR) rather than TCP ports on loopback.
        runtime = os.environ.get("JUPYTER_RUNTIME_DIR") or RUN_DIR
        os.makedirs(runtime, mode=0o700, exist_ok=True)
        km = AsyncKernelManager(kernel_name="python3", transport="ipc",
                                ip=os.path.join(runtime, f"kernel-{self.id}"),
                                connection_file=os.path.join(runtime, f"kernel-{self.id}.json"))
        # No SQLite history: no background writer thread and no file shared by forks.
        await km.start_kernel(cwd=self.cwd, extra_arguments=["--HistoryManager.enabled=False"])
        kc = km.client()
        kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=KERNEL_START_TIMEOUT)
        except BaseException:
            kc.stop_channels()
            with contextlib.suppress(Exception):
                await km.shutdown_kernel(now=True)
            raise
        self.km, self.kc = km, kc

    async def stop(self) -> None:
        kc, km, self.kc, self.km = self.kc, self.km, None, None
        if kc is not None:
            kc.stop_channels()
        if km is not None:
            with contextlib.suppress(Exception):
                await km.shutdown_kernel(now=True)

    async def _restart_dead(self) -> None:
        await self.stop()
        await self.start()

    async def _silent(self, code: str) -> None:
        """Run bookkeeping code that leaves no trace in the history or the output."""
        msg_id = self.kc.execute(code, silent=True, store_history=False, allow_stdin=False)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                msg = await self.kc.get_shell_msg(timeout=SLICE)
                if msg["parent_header"].get("msg_id") == msg_id:
                    return
            if not await self.km.is_alive():
                return

    async def execute(self, code: str, run: Run, env: dict[str, str] | None,
                      store_history: bool) -> int | None:
        if self.km is None or not await self.km.is_alive():
            await self._restart_dead()
        if env:
            await self._silent(
                "_pandastack_env_saved = {k: __import__('os').environ.get(k) for k in "
                f"{sorted(env)!r}}}; __import__('os').environ.update({env!r})")
        try:
            return await self._execute(code, run, store_history)
        finally:
            if env and self.km is not None and await self.km.is_alive():
                await self._silent(
                    "(lambda o, s: [o.environ.pop(k, None) if v is None else "
                    "o.environ.__setitem__(k, v) for k, v in s.items()])"
                    "(__import__('os'), _pandastack_env_saved); del _pandastack_env_saved")

    async def _execute(self, code: str, run: Run, store_history: bool) -> int | None:
        kc, out = self.kc, run.out
        msg_id = kc.execute(code, store_history=store_history, allow_stdin=False,
                            stop_on_error=False)
        count: int | None = None
        stopped: str | None = None  # why we interrupted the kernel
        stopped_at = 0.0
        idle = False
        while not idle:
            if stopped is None:
                stopped = run.stop_reason()
                if stopped is not None:
                    stopped_at = time.monotonic()
                    with contextlib.suppress(Exception):
                        await self.km.interrupt_kernel()
            elif time.monotonic() - stopped_at > INTERRUPT_GRACE:
                await self._restart_dead()
                await run.stopped(stopped, "; the kernel did not stop when interrupted and was "
                                  "restarted: its state is lost")
                return None
            try:
                msg = await kc.get_iopub_msg(timeout=SLICE)
            except Exception:  # queue.Empty: nothing arrived in this slice
                if not await self.km.is_alive():
                    await self._restart_dead()
                    await out.error("DeadKernelError", "the kernel died while running the code; "
                                    "it was restarted and its state is lost")
                    return None
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "status":
                idle = content.get("execution_state") == "idle"
            elif kind == "execute_input":
                count = content.get("execution_count", count)
            elif kind == "stream":
                await out.text("stderr" if content.get("name") == "stderr" else "stdout",
                               str(content.get("text", "")))
            elif kind in ("execute_result", "display_data", "update_display_data"):
                await out.result(_bundle(content.get("data") or {}),
                                 kind == "execute_result")
            elif kind == "error":
                traceback = "\n".join(str(t) for t in content.get("traceback") or ())
                if stopped is not None and content.get("ename") == "KeyboardInterrupt":
                    await run.stopped(stopped, "; the kernel was interrupted and keeps its state",
                                      traceback)
                else:
                    await out.error(str(content.get("ename", "Error")),
                                    str(content.get("evalue", "")), traceback)
        # The reply was sent before the idle status: take it, so replies never pile up.
        with contextlib.suppress(Exception):
            while True:
                reply = await kc.get_shell_msg(timeout=5 if count is None else 0.05)
                if reply["parent_header"].get("msg_id") == msg_id:
                    count = reply["content"].get("execution_count", count)
                    break
        return count if store_history else None


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
        os.makedirs(RUN_DIR, mode=0o700, exist_ok=True)
        script = os.path.join(RUN_DIR, f"{self.id}.sh")
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


# --- javascript ----------------------------------------------------------------------------

NODE_RUNNER = r"""
'use strict';
const vm = require('vm');
const util = require('util');
const readline = require('readline');
const write = process.stdout.write.bind(process.stdout);
let token = null;
const send = (o) => { o.token = token; write(JSON.stringify(o) + '\n'); };
const fmt = (args) => util.formatWithOptions({ colors: false }, ...args) + '\n';
const stream = (t) => (chunk, enc, cb) => {
  send({ t, text: typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString() });
  const done = typeof enc === 'function' ? enc : cb;
  if (typeof done === 'function') done();
  return true;
};
process.stdout.write = stream('stdout');
process.stderr.write = stream('stderr');
const out = (...a) => send({ t: 'stdout', text: fmt(a) });
const err = (...a) => send({ t: 'stderr', text: fmt(a) });
const con = { log: out, info: out, debug: out, dir: out, error: err, warn: err, trace: err };
process.on('uncaughtException', (e) => send({ t: 'stderr', text: String(e && e.stack || e) }));
process.on('unhandledRejection', (e) => send({ t: 'stderr', text: String(e && e.stack || e) }));
const ctx = vm.createContext({
  console: con, require, process, Buffer, URL, URLSearchParams, TextEncoder, TextDecoder,
  setTimeout, clearTimeout, setInterval, clearInterval, setImmediate, clearImmediate,
  queueMicrotask, structuredClone, fetch: globalThis.fetch,
});
let n = 0;
const within = (p, ms) => ms ? Promise.race([p, new Promise((_, rej) => setTimeout(() => {
  const e = new Error(`Promise not settled after ${ms} ms`); e.name = 'TimeoutError'; rej(e);
}, ms))]) : p;
// The runner's own frames (vm, this file) say nothing about the user's code.
const cellFrames = (stack) => {
  const lines = stack.split('\n');
  const cut = lines.findIndex((l) => l.includes('runInContext') || l.includes('[eval]'));
  return (cut > 0 ? lines.slice(0, cut) : lines).join('\n');
};
async function run(req) {
  token = req.token;
  const started = Date.now();
  const saved = {};  // per-run variables: restored afterwards
  for (const [k, v] of Object.entries(req.env || {})) {
    saved[k] = process.env[k];
    process.env[k] = v;
  }
  try {
    const script = new vm.Script(req.code, { filename: `<cell ${++n}>` });
    let value = script.runInContext(ctx, { timeout: req.timeout_ms || undefined,
                                           displayErrors: false });
    if (value && typeof value.then === 'function') {
      const left = req.timeout_ms ? Math.max(1, req.timeout_ms - (Date.now() - started)) : 0;
      value = await within(value, left);
    }
    if (value !== undefined) {
      send({ t: 'result', text: util.inspect(value, { colors: false, depth: 4 }) });
    }
  } catch (e) {
    const timedOut = e && e.code === 'ERR_SCRIPT_EXECUTION_TIMEOUT';
    const isObj = e !== null && typeof e === 'object';
    send({ t: 'error', name: timedOut ? 'TimeoutError' : String(isObj && e.name || 'Error'),
           value: String(isObj && e.message !== undefined ? e.message : e),
           traceback: timedOut ? '' : cellFrames(String(isObj && e.stack || e)) });
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k]; else process.env[k] = v;
    }
  }
  send({ t: 'end', count: n });
}
let chain = Promise.resolve();
readline.createInterface({ input: process.stdin, terminal: false }).on('line', (line) => {
  chain = chain.then(() => run(JSON.parse(line)));
});
"""


class NodeContext(ProcessContext):
    language = "javascript"

    def __init__(self, ctx_id: str, cwd: str) -> None:
        super().__init__(ctx_id, cwd)
        self.partial = bytearray()

    def argv(self) -> list[str]:
        return ["node", "-e", NODE_RUNNER]

    async def start(self) -> None:
        self.partial = bytearray()
        await super().start()

    async def execute(self, code: str, run: Run, env: dict[str, str] | None,
                      store_history: bool) -> int | None:
        proc = await self._ensure()
        assert proc.stdin is not None
        token = secrets.token_hex(8)
        req: dict[str, Any] = {"code": code, "token": token}
        if run.timeout is not None:
            req["timeout_ms"] = max(1, int(run.timeout * 1000))
        if env:
            req["env"] = env
        count, reason = await self._exchange(
            proc, json.dumps(req).encode() + b"\n", lambda: self._collect(token, run))
        if reason is not None:
            await self.stop()
            await run.stopped(reason, "; node did not stop and was restarted: its state is lost")
        elif count is None:
            await self.stop()
            await run.out.error("ExitError", "node exited; a new one starts with the next run: "
                                "its state is lost")
        return count

    async def _collect(self, token: str, run: Run) -> tuple[int | None, str | None]:
        reason: str | None = None
        stopped_at = 0.0
        stderr = codecs.getincrementaldecoder("utf-8")("replace")
        while True:
            if reason is None:
                reason = run.stop_reason()
                # node enforces the timeout itself (vm timeout); this is the backstop.
                if reason == "timeout":
                    reason = None if time.monotonic() < (run.deadline or 0) + 5 else reason
                if reason is not None:
                    stopped_at = time.monotonic()
            elif time.monotonic() - stopped_at > 1.0:
                return None, reason
            item = await self._next()
            if item is None:
                continue
            name, data = item
            if not data:
                if name == "stdout":
                    return None, reason
                continue
            if name == "stderr":  # node's own messages (the runner sends everything else)
                await run.out.text("stderr", stderr.decode(data))
                continue
            self.partial += data
            while (nl := self.partial.find(b"\n")) >= 0:
                line, self.partial = bytes(self.partial[:nl]), self.partial[nl + 1:]
                try:
                    ev = json.loads(line)
                except (ValueError, RecursionError):
                    continue
                if not isinstance(ev, dict) or ev.get("token") != token:
                    continue  # a timer of an earlier run
                t = ev.get("t")
                if t in ("stdout", "stderr"):
                    await run.out.text(t, str(ev.get("text", "")))
                elif t == "result":
                    await run.out.result({"text/plain": str(ev.get("text", ""))}, True)
                elif t == "error":
                    await run.out.error(str(ev.get("name", "Error")), str(ev.get("value", "")),
                                        str(ev.get("traceback", "")))
                elif t == "end":
                    count = ev.get("count")
                    return (count if isinstance(count, int) else 0), None


# --- the server ----------------------------------------------------------------------------

CONTEXT_TYPES: dict[str, type[Context]] = {
    "python": PythonContext, "bash": BashContext, "javascript": NodeContext}


def _python_available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("jupyter_client", "ipykernel"))


class Server:
    def __init__(self, default_cwd: str = DEFAULT_CWD) -> None:
        self.default_cwd = default_cwd
        self.contexts: dict[str, Context] = {}
        self.defaults: dict[str, str] = {}
        self.create_lock = asyncio.Lock()
        self.tasks: set[asyncio.Task[None]] = set()

    @staticmethod
    def language(value: object) -> str:
        if not isinstance(value, str) or not value:
            raise Failure("invalid_request", "'language' must be a non-empty string")
        lang = ALIASES.get(value.lower(), value.lower())
        if lang not in CONTEXT_TYPES:
            raise Failure("unsupported_language", f"unsupported language {value!r} "
                          f"(supported: {', '.join(LANGUAGES)})")
        if lang == "javascript" and shutil.which("node") is None:
            raise Failure("unsupported_language",
                          "javascript is not available in this template (no node on PATH)")
        if lang == "python" and not _python_available():
            raise Failure("unsupported_language",
                          "python is not available in this template (no ipykernel)")
        return lang

    async def create(self, lang: str, cwd: str, *, default: bool = False) -> Context:
        if not os.path.isdir(cwd):
            raise Failure("invalid_request", f"cwd {cwd!r} is not a directory")
        async with self.create_lock:
            if default and lang in self.defaults:
                return self.contexts[self.defaults[lang]]
            if len(self.contexts) >= MAX_CONTEXTS:
                raise Failure("limit", f"too many code contexts (at most {MAX_CONTEXTS}): "
                              "delete one first")
            ctx_id = f"default-{lang}" if default else secrets.token_hex(6)
            ctx = CONTEXT_TYPES[lang](ctx_id, cwd)
            # Registered before it starts (starting a kernel is slow), so that concurrent
            # creates count it; its lock is taken at once, so runs wait until it started.
            self.contexts[ctx_id] = ctx
            if default:
                self.defaults[lang] = ctx_id
            await ctx.lock.acquire()
        try:
            await ctx.start()
        except BaseException:
            self._forget(ctx)
            raise
        finally:
            ctx.lock.release()
        return ctx

    def _forget(self, ctx: Context) -> None:
        if self.contexts.get(ctx.id) is ctx:
            del self.contexts[ctx.id]
        if self.defaults.get(ctx.language) == ctx.id:
            del self.defaults[ctx.language]

    def get(self, ctx_id: object) -> Context:
        if not isinstance(ctx_id, str) or ctx_id not in self.contexts:
            raise Failure("context_not_found", f"no code context {ctx_id!r}")
        return self.contexts[ctx_id]

    async def default(self, lang: str) -> Context:
        ctx_id = self.defaults.get(lang)
        if ctx_id is not None:
            ctx = self.contexts[ctx_id]
            # Wait for a concurrent first start of the same default context.
            async with ctx.lock:
                pass
            if self.contexts.get(ctx_id) is ctx:
                return ctx
        return await self.create(lang, self.default_cwd, default=True)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        out = Output(writer)
        try:
            try:
                line = await reader.readuntil(b"\n")
                req = json.loads(line)
                if not isinstance(req, dict) or not isinstance(req.get("op"), str):
                    raise ValueError("a request is a JSON object with an 'op'")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
                raise Failure("invalid_request", f"bad request line: {e}") from None
            watch = asyncio.create_task(self._watch_client(reader, out))
            try:
                await self.dispatch(req, out)
            finally:
                watch.cancel()
        except Failure as f:
            await out.send({"type": "failure", "code": f.code, "message": f.message})
        except Exception as e:
            log.exception("request failed")
            await out.send({"type": "failure", "code": "internal",
                            "message": f"{type(e).__name__}: {e}"})
        finally:
            with contextlib.suppress(Exception):
                writer.close()
                await writer.wait_closed()

    @staticmethod
    async def _watch_client(reader: asyncio.StreamReader, out: Output) -> None:
        # The relay closes the connection when the host abandons the run.
        with contextlib.suppress(Exception):
            while await reader.read(4096):
                pass
        out.gone.set()

    async def dispatch(self, req: dict[str, Any], out: Output) -> None:
        op = req["op"]
        if op == "run":
            await self.run(req, out)
        elif op == "create_context":
            lang = self.language(req.get("language", "python"))
            cwd = req.get("cwd") or self.default_cwd
            if not isinstance(cwd, str):
                raise Failure("invalid_request", "'cwd' must be a string")
            ctx = await self.create(lang, cwd)
            await out.send({"type": "ok", "context": ctx.describe()})
        elif op == "list_contexts":
            await out.send({"type": "ok",
                            "contexts": [c.describe() for c in self.contexts.values()]})
        elif op in ("delete_context", "restart_context"):
            ctx = self.get(req.get("id"))
            if op == "delete_context":
                self._forget(ctx)
                await ctx.delete()
            else:
                await ctx.restart()
            await out.send({"type": "ok"})
        else:
            raise Failure("invalid_request", f"unknown op {op!r}")

    async def run(self, req: dict[str, Any], out: Output) -> None:
        code = req.get("code")
        if not isinstance(code, str):
            raise Failure("invalid_request", "'code' must be a string")
        try:
            code.encode()
        except UnicodeEncodeError:
            raise Failure("invalid_request", "'code' is not valid text (lone surrogates)") from None
        timeout = req.get("timeout")
        if timeout is not None and (isinstance(timeout, bool)
                                    or not isinstance(timeout, int | float) or timeout <= 0):
            raise Failure("invalid_request", "'timeout' must be a positive number")
        env = req.get("env") or None
        if env is not None and (not isinstance(env, dict) or len(env) > MAX_ENV or not all(
                isinstance(k, str) and isinstance(v, str) and ENV_NAME.match(k) and "\0" not in v
                and not any("\ud800" <= c <= "\udfff" for c in v) for k, v in env.items())):
            raise Failure("invalid_request", "'env' must map at most "
                          f"{MAX_ENV} variable names to strings")
        ctx_id = req.get("context_id")
        if ctx_id is not None:
            ctx = self.get(ctx_id)
        else:
            ctx = await self.default(self.language(req.get("language", "python")))
        store_history = req.get("store_history", True) is not False
        run = Run(out, timeout, ctx.abort)
        count = await ctx.run(code, run, env, store_history)
        await out.send({"type": "end", "execution_count": count})

    async def close(self) -> None:
        for ctx in list(self.contexts.values()):
            with contextlib.suppress(Exception):
                await ctx.stop()


async def serve(path: str, default_cwd: str = DEFAULT_CWD) -> None:
    server = Server(default_cwd)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    # Bound under a temporary name and renamed once listening: a client that sees the path can
    # connect (the template's readiness check waits for the path).
    tmp = f"{path}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    srv = await asyncio.start_unix_server(server.handle, path=tmp, limit=MAX_REQUEST_LINE)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    log.info("listening on %s", path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with srv:
            await stop.wait()
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        await server.close()


def main(argv: list[str] | None = None) -> int:
    global RUN_DIR
    p = argparse.ArgumentParser(description="pandastack code interpreter server")
    p.add_argument("--socket", default=SOCKET_PATH)
    p.add_argument("--cwd", default=DEFAULT_CWD, help="working directory of default contexts")
    args = p.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="kernel-server[%(process)d] %(levelname)s %(message)s")
    RUN_DIR = os.path.join(os.path.dirname(os.path.abspath(args.socket)), "code")
    # Connection files of the kernels belong on tmpfs, not in the image's /root.
    os.environ.setdefault("JUPYTER_RUNTIME_DIR", RUN_DIR)
    asyncio.run(serve(args.socket, args.cwd))
    return 0


if __name__ == "__main__":
    sys.exit(main())
