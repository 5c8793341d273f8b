"""Background processes followed live (`Process.stream()`, `Commands.connect()`): the event
type, the decoder of `GET .../processes/{pid}/stream` and its call builders. No I/O; the twins
in `sdk/commands.py` run them. Also the calls of the lifecycle conveniences (`set_timeout`,
`is_running`, paged `list`), which `_base.py` has no room for."""

from __future__ import annotations

import builtins
import datetime as _dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

import httpx

from pandastack.sdk._base import (
    Call,
    StreamName,
    encode,
    error_from_event,
    model_decoder,
    parse_model,
    sandbox_path,
    wire_json,
    with_read_timeout,
)
from pandastack.sdk._sse import ServerSentEvent, SSEDecoder
from pandastack.sdk.errors import NotFoundError, ProtocolError
from pandastack.wire import sandboxes as wire
from pandastack.wire.sandboxes import ExecResult, Lifecycle, ProcessInfo, SandboxInfo

__all__ = ["ProcessEvent", "ProcessStreamDecoder", "SandboxPage"]

T = TypeVar("T")

EventType = Literal["stdout", "stderr", "dropped", "exit"]
KEPT_CHARS = 1 << 20
"""What a stream keeps of each output stream for its exit's result: as much as the guest's
ring holds, so `wait()` with callbacks returns what `wait()` without them would."""


@dataclass(frozen=True, slots=True)
class ProcessEvent:
    """One event of `Process.stream()`.

    - ``"stdout"`` / ``"stderr"``: `data` is a chunk of text as the process wrote it (replayed
      from the guest's buffer first, then live).
    - ``"dropped"``: comes first, and only when the guest's ring buffer (the last 1 MiB of each
      stream) had already lost the start of the output: `dropped` maps ``"stdout"`` and
      ``"stderr"`` to the bytes lost. The replay that follows is the tail.
    - ``"exit"``: the last event; `result` is the process's `ExecResult` with the output the
      stream carried (at most its last `KEPT_CHARS` characters per stream, so following a
      process for days stays bounded; `timed_out` if its `timeout_seconds` killed it).
    """

    type: EventType
    data: str = ""
    dropped: Mapping[str, int] = field(default_factory=dict)
    result: ExecResult | None = None


class ProcessStreamDecoder:
    """Decodes the process event stream. `feed()`/`close()` return the events completed;
    an `error` event raises its `APIError`. After `exit`, `done` is true and `result()` is the
    `ExecResult` holding the output the stream carried."""

    def __init__(self) -> None:
        self._sse = SSEDecoder()
        self._chunks: dict[StreamName, list[str]] = {"stdout": [], "stderr": []}
        self._kept: dict[StreamName, int] = {"stdout": 0, "stderr": 0}
        self._exit: ExecResult | None = None

    @property
    def done(self) -> bool:
        return self._exit is not None

    def feed(self, chunk: bytes) -> list[ProcessEvent]:
        return self._handle(self._sse.feed(chunk))

    def close(self) -> list[ProcessEvent]:
        return self._handle(self._sse.close())

    def _handle(self, events: list[ServerSentEvent]) -> list[ProcessEvent]:
        out: list[ProcessEvent] = []
        for event in events:
            if self._exit is not None:
                break
            if event.event in ("stdout", "stderr"):
                name: StreamName = "stdout" if event.event == "stdout" else "stderr"
                payload = self._json(event)
                text = payload.get("data") if isinstance(payload, dict) else None
                if not isinstance(text, str):
                    raise ProtocolError(f"process stream: {name} event lacks a string 'data'")
                self._keep(name, text)
                out.append(ProcessEvent(name, data=text))
            elif event.event == "dropped":
                payload = self._json(event)
                if not isinstance(payload, dict):
                    raise ProtocolError("process stream: dropped event is not an object")
                lost = {k: v for k, v in payload.items()
                        if k in ("stdout", "stderr") and isinstance(v, int)}
                out.append(ProcessEvent("dropped", dropped=lost))
            elif event.event == "exit":
                self._exit = parse_model(ExecResult, self._json(event), "process exit event")
                out.append(ProcessEvent("exit", result=self.result()))
            elif event.event == "error":
                raise error_from_event(event.data)
            # anything else: an event this SDK does not know yet; skip it
        return out

    def _keep(self, name: StreamName, text: str) -> None:
        chunks = self._chunks[name]
        chunks.append(text)
        self._kept[name] += len(text)
        if self._kept[name] > 2 * KEPT_CHARS:  # compact now and then: amortised O(1)
            tail = "".join(chunks)[-KEPT_CHARS:]
            chunks[:] = [tail]
            self._kept[name] = len(tail)

    @staticmethod
    def _json(event: ServerSentEvent) -> Any:
        try:
            return wire_json(event.data)
        except ValueError as exc:
            raise ProtocolError(f"process stream: {event.event} event is not JSON") from exc

    def result(self) -> ExecResult:
        """The exit's result with the streamed output; `ProtocolError` before the exit."""
        if self._exit is None:
            raise ProtocolError("process stream ended before its exit event")
        return self._exit.model_copy(update={
            "stdout": "".join(self._chunks["stdout"])[-KEPT_CHARS:],
            "stderr": "".join(self._chunks["stderr"])[-KEPT_CHARS:]})


def stream_call(sandbox_id: str, pid: int, *, base_timeout: httpx.Timeout,
                timeout_seconds: float | None = None) -> Call[None]:
    """A process may stay silent for hours: no read timeout unless one is asked for."""
    timeout = with_read_timeout(base_timeout, None)
    if timeout_seconds is not None:
        timeout = httpx.Timeout(connect=base_timeout.connect, read=timeout_seconds,
                                write=base_timeout.write, pool=base_timeout.pool)
    return Call("GET", sandbox_path(sandbox_id, "processes", pid, "stream"), lambda r: None,
                headers={"Accept": "text/event-stream"}, timeout=timeout)


def find_process(processes: builtins.list[ProcessInfo], pid: int) -> ProcessInfo:
    for info in processes:
        if info.pid == pid:
            return info
    raise NotFoundError(f"no process {pid} in this sandbox (running, or among the last 64 "
                        "that ended)", status=404, code="not_found")


def set_timeout_call(sandbox_id: str, seconds: int) -> Call[Lifecycle]:
    body = encode(wire.UpdateLifecycle, timeout_seconds=seconds)
    return Call("PATCH", sandbox_path(sandbox_id, "lifecycle"), model_decoder(Lifecycle),
                json=body)


class SandboxPage(builtins.list[T], Generic[T]):
    """A list of sandboxes (handles) with `next_token`: pass it back to `list()` (with the same
    filters) for the next page; None when this is the last one (always, without `limit`)."""

    next_token: str | None = None

    def __init__(self, items: builtins.list[T], next_token: str | None = None) -> None:
        super().__init__(items)
        self.next_token = next_token


Page = tuple[builtins.list[SandboxInfo], str | None]


def _timestamp(value: float | _dt.datetime) -> str:
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            raise ValueError("started_after: give an aware datetime (or Unix seconds)")
        value = value.timestamp()
    return repr(float(value))


def list_page_call(state: str | None, metadata: Mapping[str, str] | None,
                   include_ended: bool, *, template: str | None,
                   started_after: float | _dt.datetime | None, limit: int | None,
                   next_token: str | None) -> Call[Page]:
    """`_base.list_sandboxes_call` with the filters and the page asked for."""
    params = {f"metadata.{k}": v for k, v in (metadata or {}).items()}
    if state is not None:
        params["state"] = state
    elif not include_ended:
        params["include_ended"] = "false"
    if template is not None:
        params["template"] = template
    if started_after is not None:
        params["started_after"] = _timestamp(started_after)
    if limit is not None:
        params["limit"] = str(int(limit))
    if next_token is not None:
        params["next_token"] = next_token
    live = state is None and not include_ended

    def decode(response: httpx.Response) -> Page:
        listed = model_decoder(wire.SandboxList)(response)
        infos = list(listed.sandboxes)
        if live:  # a server older than include_ended lists every sandbox
            infos = [i for i in infos if i.state not in wire.ENDED_STATES]
        return infos, listed.next_token
    return Call("GET", "/v1/sandboxes", decode, params=params or None)
