"""The exec event stream's decoder and the call builders of commands and processes
(`sdk/commands.py`'s twins run them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from pandastack.sdk._base import (
    Call,
    StreamName,
    _cmd,
    _text,
    encode,
    error_from_event,
    ignore_body,
    list_decoder,
    model_decoder,
    parse_model,
    sandbox_path,
    wire_json,
    with_read_timeout,
)
from pandastack.sdk._sse import ServerSentEvent, SSEDecoder
from pandastack.sdk.errors import ProtocolError
from pandastack.wire import sandboxes as wire
from pandastack.wire.sandboxes import ExecResult, ProcessInfo


class ExecStreamDecoder:
    """Decodes the `exec/stream` event stream into output chunks and a final `ExecResult`.

    `feed()` returns `(stream, text)` pairs to hand to the callbacks; an `error` event raises the
    matching `APIError`. After `exit`, `done` is true and `result()` returns the `ExecResult` with
    the accumulated stdout/stderr.
    """

    def __init__(self) -> None:
        self._sse = SSEDecoder()
        self._chunks: dict[StreamName, list[str]] = {"stdout": [], "stderr": []}
        self._exit: ExecResult | None = None

    @property
    def done(self) -> bool:
        return self._exit is not None

    def feed(self, chunk: bytes) -> list[tuple[StreamName, str]]:
        return self._handle(self._sse.feed(chunk))

    def close(self) -> list[tuple[StreamName, str]]:
        return self._handle(self._sse.close())

    def _handle(self, events: list[ServerSentEvent]) -> list[tuple[StreamName, str]]:
        out: list[tuple[StreamName, str]] = []
        for event in events:
            if self._exit is not None:
                break
            if event.event == "stdout" or event.event == "stderr":
                name: StreamName = "stdout" if event.event == "stdout" else "stderr"
                text = self._chunk_text(event)
                self._chunks[name].append(text)
                out.append((name, text))
            elif event.event == "exit":
                self._exit = parse_model(ExecResult, self._event_json(event), "exec exit event")
            elif event.event == "error":
                raise error_from_event(event.data)
            # anything else: an event this SDK does not know yet; skip it
        return out

    @staticmethod
    def _event_json(event: ServerSentEvent) -> Any:
        try:
            return wire_json(event.data)
        except ValueError as exc:
            raise ProtocolError(f"exec stream: {event.event} event is not JSON") from exc

    def _chunk_text(self, event: ServerSentEvent) -> str:
        payload = self._event_json(event)
        text = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(text, str):
            raise ProtocolError(f"exec stream: {event.event} event lacks a string 'data'")
        return text

    def result(self) -> ExecResult:
        """The final result; `ProtocolError` if the stream ended without an `exit` event."""
        if self._exit is None:
            raise ProtocolError("exec stream ended before its exit event")
        return self._exit.model_copy(update={
            "stdout": "".join(self._chunks["stdout"]) or self._exit.stdout,
            "stderr": "".join(self._chunks["stderr"]) or self._exit.stderr,
        })


def exec_call(sandbox_id: str, cmd: str | Sequence[str], *, timeout_seconds: float,
              env: Mapping[str, str] | None, cwd: str | None, stdin: str | None,
              stream: bool, base_timeout: httpx.Timeout,
              max_output_bytes: int | None = None) -> Call[ExecResult]:
    """`exec` (or `exec/stream`), with a read timeout that outlasts `timeout_seconds`."""
    body = encode(wire.ExecRequest, cmd=_cmd(cmd), timeout_seconds=timeout_seconds,
                  env=dict(env) if env else None, cwd=cwd, stdin=stdin,
                  max_output_bytes=max_output_bytes)
    path = sandbox_path(sandbox_id, "exec", "stream") if stream else sandbox_path(sandbox_id,
                                                                                  "exec")
    headers = {"Accept": "text/event-stream"} if stream else None
    return Call("POST", path, model_decoder(ExecResult), json=body, headers=headers,
                timeout=with_read_timeout(base_timeout, timeout_seconds), span="sandbox.exec")


def start_process_call(sandbox_id: str, cmd: str | Sequence[str], *,
                       env: Mapping[str, str] | None, cwd: str | None,
                       timeout_seconds: float | None = None) -> Call[ProcessInfo]:
    body = encode(wire.StartProcess, cmd=_cmd(cmd), env=dict(env) if env else None, cwd=cwd,
                  timeout_seconds=timeout_seconds)
    return Call("POST", sandbox_path(sandbox_id, "processes"), model_decoder(ProcessInfo),
                json=body)


def list_processes_call(sandbox_id: str) -> Call[list[ProcessInfo]]:
    return Call("GET", sandbox_path(sandbox_id, "processes"),
                list_decoder(wire.ProcessList, "processes", ProcessInfo))


def send_stdin_call(sandbox_id: str, pid: int, data: str | bytes, *, eof: bool) -> Call[None]:
    return Call("POST", sandbox_path(sandbox_id, "processes", pid, "stdin"), ignore_body,
                params={"eof": "true"} if eof else None, content=_text(data),
                headers={"Content-Type": "application/octet-stream"})


def signal_call(sandbox_id: str, pid: int, sig: int) -> Call[None]:
    body = encode(wire.SignalRequest, signal=int(sig))
    return Call("POST", sandbox_path(sandbox_id, "processes", pid, "signal"), ignore_body,
                json=body)


def wait_call(sandbox_id: str, pid: int, *, timeout_seconds: float | None,
              base_timeout: httpx.Timeout) -> Call[ExecResult]:
    params = {"timeout_seconds": f"{timeout_seconds:g}"} if timeout_seconds is not None else None
    return Call("POST", sandbox_path(sandbox_id, "processes", pid, "wait"),
                model_decoder(ExecResult), params=params,
                timeout=with_read_timeout(base_timeout, timeout_seconds))
