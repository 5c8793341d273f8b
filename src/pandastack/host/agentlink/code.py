"""Host side of the code interpreter: `code` requests through the guest agent.

The agent relays one JSON request to the interpreter inside the guest (kernel_server.py) and
streams its newline-delimited JSON answer back as `data` frames (spec/guest-protocol.md,
`code`). This module turns those lines into `CodeEvent`s and the interpreter's `failure`
answers into host errors. `AgentClient` and `SandboxHandle` expose it as methods.

The interpreter runs in the guest, so nothing it sends is trusted: lines are bounded, and so
is what one run may produce (results, their size, output text) whatever the interpreter's own
caps; crossing a bound ends the run (it is interrupted) with AgentLimitError.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import AsyncGenerator, Mapping
from typing import TYPE_CHECKING, Any, cast

from pandastack.guestproto import frames as P
from pandastack.hostport.errors import (
    AgentLimitError,
    CodeContextNotFound,
    CodeInterpreterError,
    CodeInterpreterUnavailable,
    GuestOSError,
    UnsupportedLanguage,
)
from pandastack.hostport.results import CodeEvent

if TYPE_CHECKING:
    from pandastack.host.agentlink.client import AgentClient

# Longest event line accepted from the interpreter; it caps its own lines at 32 MiB.
MAX_EVENT_LINE = 40 * 2**20
# A context operation is answered by one short `ok` line (at most 16 contexts described).
MAX_ANSWER_LINE = 2**20
# What one run may produce, above what the interpreter sends an honest run (it drops results
# past 5 000 or 48 MiB and output past 16 Mi characters, with a note).
MAX_RUN_RESULTS = 10_000
MAX_RUN_RESULT_CHARS = 64 * 2**20  # mime types and data of all results together
MAX_RUN_TEXT = 20 * 2**20  # characters of stdout and stderr together
# Characters of the interpreter's words kept in an error message (a line can be 40 MiB).
MAX_MESSAGE = 4096
# Creating or restarting a context starts a kernel: tens of seconds under TCG.
CONTEXT_TIMEOUT = 600.0
# A run with a timeout is over at most this long after it: an interrupt that is not honoured
# ends in a kernel restart, which under TCG takes a while.
RUN_GRACE = 300.0
EVENT_TYPES = frozenset({"stdout", "stderr", "result", "error", "end"})


def parse_event(obj: Mapping[str, Any]) -> CodeEvent:
    """One event line of a run (already JSON-decoded); ValueError if it is malformed."""
    t = obj.get("type")
    if t not in EVENT_TYPES:
        raise ValueError(f"unknown event type {_short(t)}")

    def text(key: str) -> str:
        v = obj.get(key, "")
        if not isinstance(v, str):
            raise ValueError(f"{t} event: {key!r} is not a string")
        return v

    if t in ("stdout", "stderr"):
        return CodeEvent(t, text=text("text"))
    if t == "result":
        data = obj.get("data")
        if not isinstance(data, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
            raise ValueError("result event: 'data' is not a map of strings")
        return CodeEvent(t, data=dict(data), is_main_result=obj.get("is_main_result") is True)
    if t == "error":
        return CodeEvent(t, name=text("name"), value=text("value"), traceback=text("traceback"))
    count = obj.get("execution_count")
    if count is not None and (not isinstance(count, int) or isinstance(count, bool)):
        raise ValueError("end event: 'execution_count' is not an int")
    return CodeEvent(t, execution_count=count)


class LineSplitter:
    """Newline-delimited lines of a byte stream, each at most `limit` bytes."""

    def __init__(self, limit: int = MAX_EVENT_LINE) -> None:
        self.limit = limit
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf known to hold no newline

    @property
    def pending(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        lines: list[bytes] = []
        start = 0
        pos = self._scanned  # a long line is searched once, not once per chunk
        while (nl := self._buf.find(b"\n", pos)) >= 0:
            lines.append(bytes(self._buf[start:nl]))
            start = pos = nl + 1
        del self._buf[:start]
        self._scanned = len(self._buf)
        if len(self._buf) > self.limit or any(len(line) > self.limit for line in lines):
            raise CodeInterpreterError(
                f"the code interpreter sent a line over {self.limit} bytes")
        return lines


def _short(value: object) -> str:
    return repr(value)[:100]


def _failure(obj: Mapping[str, Any]) -> Exception:
    code = obj.get("code")
    message = str(obj.get("message") or "the request failed")[:MAX_MESSAGE]
    if code == "context_not_found":
        return CodeContextNotFound(message)
    if code == "unsupported_language":
        return UnsupportedLanguage(message)
    if code == "invalid_request":
        return ValueError(message)
    return CodeInterpreterError(message)


class RunBudget:
    """What one run has produced so far, against the MAX_RUN_* bounds."""

    def __init__(self) -> None:
        self.results = 0
        self.result_chars = 0
        self.text = 0

    def add(self, event: CodeEvent) -> None:
        """Count `event`; AgentLimitError if the run is now over a bound."""
        if event.type in ("stdout", "stderr"):
            self.text += len(event.text)
            if self.text > MAX_RUN_TEXT:
                raise AgentLimitError(f"code: the run's output is over {MAX_RUN_TEXT >> 20} "
                                      "Mi characters; it was interrupted")
        elif event.type == "result":
            self.results += 1
            self.result_chars += sum(len(k) + len(v) for k, v in (event.data or {}).items())
            if self.results > MAX_RUN_RESULTS:
                raise AgentLimitError(f"code: the run produced more than {MAX_RUN_RESULTS} "
                                      "results; it was interrupted")
            if self.result_chars > MAX_RUN_RESULT_CHARS:
                raise AgentLimitError(f"code: the run's results are over "
                                      f"{MAX_RUN_RESULT_CHARS >> 20} Mi characters; it was "
                                      "interrupted")


async def _lines(agent: AgentClient, req: dict[str, Any], deadline: float | None,
                 line_limit: int = MAX_EVENT_LINE) -> AsyncGenerator[dict[str, Any], None]:
    """The interpreter's answer to `req`, line by line. Closing the generator early cancels
    the request (the interpreter then interrupts a run)."""
    payload = json.dumps(req, separators=(",", ":")).encode()
    if len(payload) > P.MAX_PAYLOAD:
        raise ValueError(f"code request of {len(payload)} bytes is over {P.MAX_PAYLOAD}")
    splitter = LineSplitter(line_limit)
    with agent._operation("code") as op:
        await agent._request(op, {}, payload)
        while True:
            try:
                f = await agent._next(
                    op, None if deadline is None else deadline - time.monotonic())
            except GuestOSError as e:
                op.finished = True
                if e.errno_name == "code_unavailable":
                    raise CodeInterpreterUnavailable(e.message) from None
                raise
            if f.t == "eof":
                op.finished = True
                if splitter.pending:
                    raise CodeInterpreterError("the code interpreter's answer ends mid-line")
                return
            if f.t != "data":
                raise agent._protocol_error(f"code: unexpected {f.t!r} frame")
            for line in splitter.feed(f.payload):
                try:
                    obj = P.parse_json(line)
                except ValueError:
                    obj = None
                if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
                    raise CodeInterpreterError("the code interpreter sent a line that is not "
                                               "a JSON object with a 'type'")
                yield obj
            await agent._consumed(op, len(f.payload))


async def run_code(agent: AgentClient, code: str, *, language: str = "python",
                   context_id: str | None = None, timeout: float | None = None,
                   env: Mapping[str, str] | None = None,
                   store_history: bool = True) -> AsyncGenerator[CodeEvent, None]:
    """The events of one run; the last is always "end". `store_history=False` leaves the
    execution count (and In/Out) alone: template warm-ups use it."""
    if not isinstance(code, str):
        raise TypeError("code must be a str")
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise ValueError("timeout must be a positive number of seconds")
    req: dict[str, Any] = {"op": "run", "code": code, "language": language,
                           "context_id": context_id, "timeout": timeout,
                           "env": dict(env) if env else None}
    if not store_history:
        req["store_history"] = False
    deadline = None if timeout is None else time.monotonic() + timeout + RUN_GRACE
    lines = _lines(agent, req, deadline)
    budget = RunBudget()
    try:
        async for obj in lines:
            if obj["type"] == "failure":
                raise _failure(obj)
            try:
                event = parse_event(obj)
            except ValueError as e:
                raise CodeInterpreterError(f"bad event from the code interpreter: {e}") from None
            budget.add(event)
            yield event
            if event.type == "end":
                return
    finally:
        await lines.aclose()
    # The interpreter went away mid-run (it died, or was killed from inside the sandbox).
    yield CodeEvent("error", name="CodeInterpreterError",
                    value="the code interpreter stopped before the run finished")
    yield CodeEvent("end")


async def call(agent: AgentClient, req: dict[str, Any],
               timeout: float = CONTEXT_TIMEOUT) -> dict[str, Any]:
    """A request answered by one `ok` line (the context operations)."""
    lines = _lines(agent, req, time.monotonic() + timeout, MAX_ANSWER_LINE)
    try:
        async for obj in lines:
            if obj["type"] == "failure":
                raise _failure(obj)
            if obj["type"] == "ok":
                return obj
            raise CodeInterpreterError(f"unexpected answer {_short(obj['type'])} to {req['op']}")
    finally:
        await lines.aclose()
    raise CodeInterpreterError(f"the code interpreter did not answer {req['op']}")


def _context(obj: object) -> dict[str, object]:
    if not isinstance(obj, dict) or not isinstance(obj.get("id"), str):
        raise CodeInterpreterError("the code interpreter described a context without an id")
    return {"id": obj["id"], "language": obj.get("language"), "cwd": obj.get("cwd")}


async def create_context(agent: AgentClient, language: str = "python",
                         cwd: str | None = None) -> dict[str, object]:
    reply = await call(agent, {"op": "create_context", "language": language, "cwd": cwd})
    return _context(reply.get("context"))


async def list_contexts(agent: AgentClient) -> list[dict[str, object]]:
    reply = await call(agent, {"op": "list_contexts"}, agent.op_timeout)
    items = reply.get("contexts")
    if not isinstance(items, list):
        raise CodeInterpreterError("the code interpreter sent no context list")
    return [_context(c) for c in items]


async def delete_context(agent: AgentClient, context_id: str) -> None:
    await call(agent, {"op": "delete_context", "id": context_id})


async def restart_context(agent: AgentClient, context_id: str) -> None:
    await call(agent, {"op": "restart_context", "id": context_id})


class CodeMethods:
    """The code interpreter methods of `AgentClient` (kept here, beside what they use)."""

    def run_code(self, code: str, *, language: str = "python", context_id: str | None = None,
                 timeout: float | None = None,
                 env: Mapping[str, str] | None = None) -> AsyncGenerator[CodeEvent, None]:
        """Run `code` in a code context (the language's default one unless `context_id`) and
        yield its events; the last one is always "end". `timeout` interrupts the run (an
        "error" event named TimeoutError; the context keeps its state); leaving the loop early
        interrupts it too. `env` applies to this run only."""
        return run_code(cast("AgentClient", self), code, language=language,
                        context_id=context_id, timeout=timeout, env=env)

    async def create_code_context(self, language: str = "python",
                                  cwd: str | None = None) -> dict[str, object]:
        """A new code context: `{"id", "language", "cwd"}`."""
        return await create_context(cast("AgentClient", self), language, cwd)

    async def list_code_contexts(self) -> list[dict[str, object]]:
        return await list_contexts(cast("AgentClient", self))

    async def delete_code_context(self, context_id: str) -> None:
        await delete_context(cast("AgentClient", self), context_id)

    async def restart_code_context(self, context_id: str) -> None:
        """Start the context afresh (its state is lost)."""
        await restart_context(cast("AgentClient", self), context_id)
