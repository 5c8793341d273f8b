"""The code interpreter's calls, result types and event-stream decoder: everything the sync and
async `CodeInterpreter` twins share that does no I/O."""

from __future__ import annotations

import base64
import json as _json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from pandastack.sdk import _base
from pandastack.sdk._sse import ServerSentEvent, SSEDecoder
from pandastack.sdk.errors import ProtocolError
from pandastack.wire import sandboxes as wire

Language = Literal["python", "bash", "javascript"]


class Result(wire.CodeResult):
    """One rich output of a run. `data` maps MIME types to content; the properties below
    read the common ones (binary formats stay base64 text, `png_bytes()` decodes)."""

    def _get(self, mime: str) -> str | None:
        return self.data.get(mime)

    @property
    def text(self) -> str | None:
        return self._get("text/plain")

    @property
    def html(self) -> str | None:
        return self._get("text/html")

    @property
    def markdown(self) -> str | None:
        return self._get("text/markdown")

    @property
    def svg(self) -> str | None:
        return self._get("image/svg+xml")

    @property
    def png(self) -> str | None:
        """The PNG image, base64-encoded (as Jupyter sends it)."""
        return self._get("image/png")

    @property
    def jpeg(self) -> str | None:
        return self._get("image/jpeg")

    @property
    def latex(self) -> str | None:
        return self._get("text/latex")

    @property
    def json(self) -> Any:
        """The application/json payload, decoded (None if there is none)."""
        raw = self._get("application/json")
        if raw is None:
            return None
        try:
            return _json.loads(raw)
        except ValueError:
            return raw

    def png_bytes(self) -> bytes | None:
        raw = self.png
        return None if raw is None else base64.b64decode(raw)

    def formats(self) -> list[str]:
        """The MIME types this result carries."""
        return list(self.data)


class Execution(wire.Execution):
    """What one `run_code` produced: output text, rich results, and the error if the code
    raised (an error in the code is data, not an exception of the SDK)."""

    results: list[Result] = []  # type: ignore[assignment]

    @property
    def text(self) -> str | None:
        """The text of the main result (the value of the last expression), if any."""
        for result in self.results:
            if result.is_main_result:
                return result.text
        return None


@dataclass(frozen=True, slots=True)
class CodeEvent:
    """One event of a streamed run. `type` is "stdout"/"stderr" (`text`), "result"
    (`result`), "error" (`error`) or "end" (`execution_count`); "end" is always last."""

    type: Literal["stdout", "stderr", "result", "error", "end"]
    text: str = ""
    result: Result | None = None
    error: wire.CodeError | None = None
    execution_count: int | None = None


def _context_id(context: str | wire.CodeContext | None) -> str | None:
    return context.id if isinstance(context, wire.CodeContext) else context


def run_code_call(sandbox_id: str, code: str, *, language: Language,
                  context: str | wire.CodeContext | None, timeout_seconds: float,
                  env: Mapping[str, str] | None, stream: bool,
                  base_timeout: httpx.Timeout) -> _base.Call[Execution]:
    body = _base.encode(wire.RunCode, code=code, language=language,
                        context_id=_context_id(context), timeout_seconds=timeout_seconds,
                        env=dict(env) if env else None)
    parts = ("code", "stream") if stream else ("code",)
    headers = {"Accept": "text/event-stream"} if stream else None
    return _base.Call("POST", _base.sandbox_path(sandbox_id, *parts),
                      _base.model_decoder(Execution), json=body, headers=headers,
                      timeout=_base.with_read_timeout(base_timeout, timeout_seconds))


def create_context_call(sandbox_id: str, language: Language,
                        cwd: str | None) -> _base.Call[wire.CodeContext]:
    body = _base.encode(wire.CreateCodeContext, language=language, cwd=cwd)
    return _base.Call("POST", _base.sandbox_path(sandbox_id, "code", "contexts"),
                      _base.model_decoder(wire.CodeContext), json=body)


def list_contexts_call(sandbox_id: str) -> _base.Call[list[wire.CodeContext]]:
    return _base.Call("GET", _base.sandbox_path(sandbox_id, "code", "contexts"),
                      _base.list_decoder(wire.CodeContextList, "contexts", wire.CodeContext))


def restart_context_call(sandbox_id: str,
                         context: str | wire.CodeContext) -> _base.Call[None]:
    cid = _context_id(context) or ""
    return _base.Call("POST", _base.sandbox_path(sandbox_id, "code", "contexts", cid,
                                                 "restart"), _base.ignore_body)


def remove_context_call(sandbox_id: str, context: str | wire.CodeContext) -> _base.Call[None]:
    cid = _context_id(context) or ""
    return _base.Call("DELETE", _base.sandbox_path(sandbox_id, "code", "contexts", cid),
                      _base.ignore_body)


class CodeStreamDecoder:
    """Decodes the `code/stream` event stream into `CodeEvent`s and the final `Execution`.

    A `failure` event (the run could not happen) raises the matching `APIError`."""

    def __init__(self) -> None:
        self._sse = SSEDecoder()
        self._stdout: list[str] = []
        self._stderr: list[str] = []
        self._results: list[Result] = []
        self._error: wire.CodeError | None = None
        self._end: CodeEvent | None = None

    @property
    def done(self) -> bool:
        return self._end is not None

    def feed(self, chunk: bytes) -> list[CodeEvent]:
        return self._handle(self._sse.feed(chunk))

    def close(self) -> list[CodeEvent]:
        return self._handle(self._sse.close())

    def _handle(self, events: list[ServerSentEvent]) -> list[CodeEvent]:
        out: list[CodeEvent] = []
        for event in events:
            if self._end is not None:
                break
            decoded = self._decode(event)
            if decoded is not None:
                out.append(decoded)
        return out

    def _decode(self, event: ServerSentEvent) -> CodeEvent | None:
        if event.event == "failure":
            raise _base.error_from_event(event.data)
        if event.event not in ("stdout", "stderr", "result", "error", "end"):
            return None  # an event this SDK does not know yet
        try:
            payload = _base.wire_json(event.data)
        except ValueError as exc:
            raise ProtocolError(f"code stream: {event.event} event is not JSON") from exc
        if event.event == "stdout" or event.event == "stderr":
            text = payload.get("data") if isinstance(payload, dict) else None
            if not isinstance(text, str):
                raise ProtocolError(f"code stream: {event.event} event lacks a string 'data'")
            if event.event == "stdout":
                self._stdout.append(text)
                return CodeEvent("stdout", text=text)
            self._stderr.append(text)
            return CodeEvent("stderr", text=text)
        if event.event == "result":
            result = _base.parse_model(Result, payload, "code stream result event")
            self._results.append(result)
            return CodeEvent("result", result=result)
        if event.event == "error":
            self._error = _base.parse_model(wire.CodeError, payload, "code stream error event")
            return CodeEvent("error", error=self._error)
        count = payload.get("execution_count") if isinstance(payload, dict) else None
        self._end = CodeEvent("end", execution_count=count if isinstance(count, int) else None)
        return self._end

    def result(self) -> Execution:
        if self._end is None:
            raise ProtocolError("code stream ended before its end event")
        return Execution(stdout="".join(self._stdout), stderr="".join(self._stderr),
                         results=self._results, error=self._error,
                         execution_count=self._end.execution_count)
