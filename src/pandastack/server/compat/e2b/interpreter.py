"""E2B's code interpreter (sandbox port 49999) over ours: `POST /execute` and `/contexts`.

E2B's `e2b-code-interpreter` SDK posts `{code, context_id | language, env_vars}` to
`/execute` and reads newline-delimited JSON back, one object a line, as the run produces
them: `stdout` / `stderr` (`text`, `timestamp`), `result` (a MIME bundle spread over named
fields: `text`, `html`, `png`, ..., the other types in `extra`), `error` (`name`, `value`,
`traceback`), `number_of_executions`, then `end_of_execution`; a run that could not finish
ends with an `error` named UnexpectedEndOfExecution and `unexpected_end_of_execution`.
`/contexts` creates, lists, restarts and deletes code contexts.

Everything here is our code interpreter (the sandbox port's `run_code` and context
operations, as `routes/code.py` calls them): its events translated, nothing added in the
guest. What one run may produce is bounded where our own routes bound it (the host's code
client: a line, a result's size, the run's output); a request body is bounded here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from pandastack.hostport.protocols import SandboxPort
from pandastack.hostport.results import CodeEvent
from pandastack.rules import MAX_ENV_ITEMS, MAX_EXEC_TIMEOUT_SECONDS
from pandastack.server.errors import ApiError, api_error_of, clean_text, host_call
from pandastack.server.routes.deps import check_text
from pandastack.server.sse import Finished, relayed
from pandastack.wire import ENDED_STATES, MAX_CODE_CHARS

from .errors import E2bError, as_e2b, e2b_response
from .target import target_of

# A request is the code (at most MAX_CODE_CHARS, what our API takes) and its env, as JSON.
MAX_BODY_BYTES = 2 << 20
MAX_LANGUAGE_CHARS = 32
MAX_ID_CHARS = 1024  # longer is a bad request; an id our interpreter never gave is a 404
MAX_CWD_CHARS = 4096
QUEUE_EVENTS = 64
# How long the answer's status waits for the run's first event. A run that cannot start
# (an unknown context, a language the template lacks, a bad env) fails at once and gets
# its own status, which the SDK raises; one that takes longer to say anything is streamed
# from then on, so a quiet run does not hold the headers back.
FIRST_EVENT_WAIT = 10.0
NDJSON = "application/x-ndjson"
# The names our interpreter takes in a run's env (kernel_server.py refuses the whole env else).
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# MIME types E2B's SDKs read as named fields of a result; the rest go to `extra`.
RESULT_FIELDS = {
    "text/plain": "text", "text/html": "html", "text/markdown": "markdown",
    "image/svg+xml": "svg", "image/png": "png", "image/jpeg": "jpeg",
    "application/pdf": "pdf", "text/latex": "latex", "application/json": "json",
    "application/javascript": "javascript", "e2b/data": "data", "e2b/chart": "chart",
}
# Our interpreter sends every value as a string (JSON ones encoded); these fields are objects.
JSON_FIELDS = frozenset({"json", "data", "chart"})


# -- translation (pure) -------------------------------------------------------------------

def line(obj: dict[str, Any]) -> bytes:
    # ASCII only: the SDKs split lines as str.splitlines does, which also breaks at U+2028,
    # U+0085 and the like; escaped, a line break can only be the one that ends the object.
    return json.dumps(obj, ensure_ascii=True, separators=(",", ":")).encode() + b"\n"


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def result_object(data: dict[str, str], is_main_result: bool) -> dict[str, Any]:
    """One of our results (MIME type -> string) as E2B's `result` line."""
    out: dict[str, Any] = {"type": "result"}
    extra: dict[str, str] = {}
    for mime, value in data.items():
        mime, value = clean_text(mime), clean_text(value)
        name = RESULT_FIELDS.get(mime)
        if name is None:
            extra[mime] = value
        elif name in JSON_FIELDS:
            parsed = _json_value(value)
            if parsed is None:
                extra[mime] = value
            else:
                out[name] = parsed
        else:
            out[name] = value
    text = out.get("text")
    # E2B shows a string's value without its repr quotes (`'hi'` is `hi`), and code written
    # for it compares `execution.text` so.
    if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        out["text"] = text[1:-1]
    out["extra"] = extra
    out["is_main_result"] = is_main_result
    return out


def event_lines(event: CodeEvent, now_ns: int) -> list[bytes]:
    """Our code event as E2B's lines (`end` is two: the count, then the end)."""
    if event.type in ("stdout", "stderr"):
        return [line({"type": event.type, "text": clean_text(event.text),
                      "timestamp": now_ns})]
    if event.type == "result":
        return [line(result_object(event.data or {}, event.is_main_result))]
    if event.type == "error":
        return [line({"type": "error", "name": clean_text(event.name),
                      "value": clean_text(event.value),
                      "traceback": clean_text(event.traceback)})]
    if event.type == "end":
        count = [] if event.execution_count is None else [
            line({"type": "number_of_executions", "execution_count": event.execution_count})]
        return [*count, line({"type": "end_of_execution"})]
    return []  # an event type E2B has no word for


def unexpected_end(message: str) -> list[bytes]:
    """A run that failed after its 200 went out: the SDK shows it as `execution.error`."""
    return [line({"type": "error", "name": "UnexpectedEndOfExecution",
                  "value": clean_text(message), "traceback": ""}),
            line({"type": "unexpected_end_of_execution"})]


@dataclasses.dataclass(frozen=True)
class RunRequest:
    code: str
    context_id: str | None
    language: str | None
    env: dict[str, str] | None


def _optional_text(body: dict[str, Any], name: str, limit: int) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise E2bError(400, f"'{name}' must be a string")
    if len(value) > limit:
        raise E2bError(400, f"'{name}' is over {limit} characters")
    check_text(value, name)
    return value


def language_of(body: dict[str, Any]) -> str | None:
    """E2B's language names as ours (`js` is javascript; our interpreter knows the other
    aliases and refuses what it does not run)."""
    language = _optional_text(body, "language", MAX_LANGUAGE_CHARS)
    if language is None or not language.strip():
        return None
    language = language.strip().lower()
    return {"js": "javascript", "ts": "typescript"}.get(language, language)


def parse_run(body: dict[str, Any]) -> RunRequest:
    code = body.get("code")
    if not isinstance(code, str):
        raise E2bError(400, "'code' must be a string")
    if len(code) > MAX_CODE_CHARS:
        raise E2bError(400, f"'code' is over {MAX_CODE_CHARS} characters")
    if "\x00" in code:
        raise E2bError(400, "'code' must not contain NUL bytes")
    context_id = _optional_text(body, "context_id", MAX_ID_CHARS) or None
    language = language_of(body)
    if context_id is not None and language is not None:
        raise E2bError(400, "give context_id or language, not both")
    env = body.get("env_vars")
    if env is not None:
        if not isinstance(env, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise E2bError(400, "'env_vars' must map names to strings")
        if len(env) > MAX_ENV_ITEMS:
            raise E2bError(400, f"'env_vars' has more than {MAX_ENV_ITEMS} variables")
        check_text(env, "env_vars")
    return RunRequest(code, context_id, language, env or None)


def _utf8(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def run_env(sandbox_env: dict[str, Any] | None,
            env_vars: dict[str, str] | None) -> dict[str, str] | None:
    """A run's env: its env_vars over the sandbox's (its template's ENV and the create's
    envs). E2B's code sees the envs a sandbox was created with; our interpreter started
    before they were known (from the template's snapshot), so each run carries them.
    Sandbox names our interpreter would refuse are left out, as are those past its bound
    (the run's own come first): one odd create-time name must not fail every run."""
    merged = dict(env_vars or {})
    for name, value in (sandbox_env or {}).items():
        if len(merged) >= MAX_ENV_ITEMS:
            break
        if name not in merged and isinstance(value, str) and ENV_NAME.fullmatch(name) \
                and "\x00" not in value and _utf8(value):
            merged[name] = value
    return merged or None


def context_object(data: dict[str, object]) -> dict[str, str]:
    cwd = data.get("cwd")
    return {"id": clean_text(str(data.get("id", ""))),
            "language": clean_text(str(data.get("language") or "")),
            "cwd": clean_text(str(cwd or ""))}


# -- the routes ---------------------------------------------------------------------------

Handler = Callable[[Request], Awaitable[Response]]


def ended_state(request: Request) -> str | None:
    """The sandbox's state if it has ended (killed, expired...) since the call began."""
    target = target_of(request)
    try:
        row = target.service.row(target.team, target.sandbox_id, touch=False)
    except ApiError:
        return "deleted"
    return row.state if row.state in ENDED_STATES else None


def answering(handler: Handler) -> Handler:
    """Our errors in E2B's shape, whichever app mounts the routes."""
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception as exc:
            error = as_e2b(exc)
            if error is None:
                raise
            if (error.status == 409 or error.status >= 500) \
                    and (state := ended_state(request)) is not None:
                # The sandbox ended under the call (its timeout, a kill): E2B's proxy says
                # 502, which the SDKs raise as a TimeoutException about the sandbox's timeout.
                return e2b_response(502, f"sandbox {target_of(request).sandbox_id} is "
                                    f"{state}: it ended while the request was in progress")
            return e2b_response(error.status, error.message,
                                getattr(exc, "headers", None) or None)
    return wrapped


async def read_json(request: Request, *, optional: bool = False) -> dict[str, Any]:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise E2bError(413, f"request body over the {MAX_BODY_BYTES}-byte limit")
    if not body.strip() and optional:
        return {}
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise E2bError(400, "the request body is not JSON") from None
    if not isinstance(value, dict):
        raise E2bError(400, "the request body is not a JSON object")
    return value


async def _handle(request: Request) -> SandboxPort:
    return (await _running(request))[1]


async def _running(request: Request) -> tuple[dict[str, Any] | None, SandboxPort]:
    """The sandbox's env and its port."""
    target = target_of(request)
    row, handle = await target.service.running(target.team, target.sandbox_id)
    return row.env, handle


async def _known_context(handle: SandboxPort, context_id: str) -> None:
    """404 as E2B answers an unknown context, before the run's 200 goes out."""
    contexts = await host_call(handle.list_code_contexts())
    if not any(c.get("id") == context_id for c in contexts):
        raise E2bError(404, f"Context {context_id} not found")


async def _events(handle: SandboxPort, run: RunRequest,
                  queue: asyncio.Queue[CodeEvent | None]) -> None:
    # No deadline of the SDK's reaches us (it times the run out by closing the connection,
    # which interrupts it); ours is the backstop.
    events = handle.run_code(run.code, language=run.language or "python",
                             context_id=run.context_id, timeout=MAX_EXEC_TIMEOUT_SECONDS,
                             env=run.env)
    async for event in events:
        await queue.put(event)


def _failure_text(exc: BaseException) -> str:
    api = api_error_of(exc)
    return api.message if api is not None else "internal error"


async def _lines(first: CodeEvent | Finished[None],
                 rest: AsyncGenerator[CodeEvent | Finished[None], None]
                 ) -> AsyncIterator[bytes]:
    item: CodeEvent | Finished[None] | None = first
    try:
        while item is not None:
            if isinstance(item, Finished):
                if item.error is not None:
                    for chunk in unexpected_end(_failure_text(item.error)):
                        yield chunk
                return
            for chunk in event_lines(item, time.time_ns()):
                yield chunk
            item = await anext(rest, None)
    finally:
        await rest.aclose()


async def _first(items: AsyncGenerator[CodeEvent | Finished[None], None]
                 ) -> CodeEvent | Finished[None]:
    return await anext(items)


async def _abandon(first: asyncio.Task[CodeEvent | Finished[None]],
                   items: AsyncGenerator[CodeEvent | Finished[None], None]) -> None:
    """Stop a run nobody will read (its generator cancels and awaits the work)."""
    first.cancel()
    with contextlib.suppress(BaseException):
        await first
    await items.aclose()


@answering
async def execute(request: Request) -> Response:
    run = parse_run(await read_json(request))
    sandbox_env, handle = await _running(request)
    run = dataclasses.replace(run, env=run_env(sandbox_env, run.env))
    if run.context_id is not None:
        await _known_context(handle, run.context_id)

    async def work(queue: asyncio.Queue[CodeEvent | None]) -> None:
        await _events(handle, run, queue)

    items = relayed(work, QUEUE_EVENTS)
    first = asyncio.create_task(_first(items))
    try:
        done, _ = await asyncio.wait({first}, timeout=FIRST_EVENT_WAIT)
        if done:
            item = first.result()
            if isinstance(item, Finished) and item.error is not None:
                # Nothing was sent yet: the failure is the answer's own status.
                raise api_error_of(item.error) or item.error
            return StreamingResponse(_lines(item, items), media_type=NDJSON)
    except BaseException:
        await _abandon(first, items)
        raise

    async def later() -> AsyncIterator[bytes]:
        try:
            item = await first
        except BaseException:
            await _abandon(first, items)
            raise
        async for chunk in _lines(item, items):
            yield chunk

    return StreamingResponse(later(), media_type=NDJSON)


@answering
async def create_context(request: Request) -> Response:
    body = await read_json(request, optional=True)
    language = language_of(body) or "python"
    cwd = _optional_text(body, "cwd", MAX_CWD_CHARS) or None
    handle = await _handle(request)
    # No cwd: our interpreter's default, the one its default contexts run in.
    data = await host_call(handle.create_code_context(language, cwd))
    return JSONResponse(context_object(data))


@answering
async def list_contexts(request: Request) -> Response:
    handle = await _handle(request)
    items = await host_call(handle.list_code_contexts())
    return JSONResponse([context_object(item) for item in items])


async def _context_call(request: Request,
                        op: Callable[[SandboxPort, str], Awaitable[None]]) -> Response:
    context_id = str(request.path_params["context_id"])
    if len(context_id) > MAX_ID_CHARS:
        raise E2bError(400, f"a context id is at most {MAX_ID_CHARS} characters")
    handle = await _handle(request)
    try:
        await host_call(op(handle, context_id))
    except ApiError as e:
        if e.status == 404:  # in the words E2B's SDKs show
            raise E2bError(404, f"Context {context_id} not found") from None
        raise
    return Response(status_code=204)


@answering
async def restart_context(request: Request) -> Response:
    return await _context_call(request, lambda h, c: h.restart_code_context(c))


@answering
async def delete_context(request: Request) -> Response:
    return await _context_call(request, lambda h, c: h.delete_code_context(c))


async def health(request: Request) -> Response:
    return JSONResponse("OK")


ROUTES: list[BaseRoute] = [
    Route("/execute", execute, methods=["POST"]),
    Route("/contexts", create_context, methods=["POST"]),
    Route("/contexts", list_contexts, methods=["GET"]),
    Route("/contexts/{context_id}/restart", restart_context, methods=["POST"]),
    Route("/contexts/{context_id}", delete_context, methods=["DELETE"]),
    Route("/health", health, methods=["GET"]),
]
