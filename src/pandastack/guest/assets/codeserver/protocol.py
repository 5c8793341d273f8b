"""The wire side of the interpreter: limits, the bounded event writer of one connection
(`Output`), what may stop a run (`Run`), and the base of every code context (`Context`)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
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

