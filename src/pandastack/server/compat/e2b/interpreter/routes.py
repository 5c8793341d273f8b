"""E2B's code interpreter routes (port 49999): `POST /execute` streams a run's lines as our
interpreter produces them, `/contexts` creates, lists, restarts and deletes contexts; the
listener (compat/e2b/listener.py) has put the sandbox into the scope. What one run may
produce is bounded where our own routes bound it (the host's code client: a line, a
result's size, the run's output); a request body is bounded here."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from pandastack.hostport.protocols import SandboxPort
from pandastack.hostport.results import CodeEvent
from pandastack.rules import E2B_DEFAULT_CWD, MAX_EXEC_TIMEOUT_SECONDS
from pandastack.server.web.errors import ApiError, api_error_of, host_call
from pandastack.server.web.sse import Finished, relayed
from pandastack.wire.sandboxes import ENDED_STATES

from ..errors import E2bError, as_e2b, e2b_response
from ..target import target_of
from .translate import (
    MAX_ID_CHARS,
    RunRequest,
    context_object,
    event_lines,
    language_of,
    optional_text,
    parse_run,
    run_env,
    unexpected_end,
)

log = logging.getLogger("pandastack.server")

# A request is the code (at most MAX_CODE_CHARS, what our API takes) and its env, as JSON.
MAX_BODY_BYTES = 2 << 20
MAX_CWD_CHARS = 4096
QUEUE_EVENTS = 64
# How long the answer's status waits for the run's first event. A run that cannot start
# (an unknown context, a language the template lacks, a bad env) fails at once and gets
# its own status, which the SDK raises; one that takes longer to say anything is streamed
# from then on, so a quiet run does not hold the headers back.
FIRST_EVENT_WAIT = 10.0
NDJSON = "application/x-ndjson"


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
                return e2b_response(502, ended_message(request, state))
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


# E2B's interpreter runs in its default user's home, where `files.read("out.csv")` looks;
# ours in /work. E2B's default context of a language is the sandbox's context whose cwd is
# spelled E2B_DEFAULT_CWD (the code-interpreter template has its python one, warm, from its
# snapshot; otherwise made on the first run without a context): a context a caller creates
# in /home/user is never taken for it, and every API server finds the same one.
E2B_CONTEXT_CWD = "/home/user"


async def _default_context(handle: SandboxPort, language: str) -> str:
    for context in await host_call(handle.list_code_contexts()):
        if context.get("language") == language and context.get("cwd") == E2B_DEFAULT_CWD:
            return str(context["id"])
    made = await host_call(handle.create_code_context(language, E2B_DEFAULT_CWD))
    return str(made["id"])


async def _events(handle: SandboxPort, run: RunRequest,
                  queue: asyncio.Queue[CodeEvent | None]) -> None:
    # No deadline of the SDK's reaches us (it times the run out by closing the connection,
    # which interrupts it); ours is the backstop.
    events = handle.run_code(run.code, language=run.language or "python",
                             context_id=run.context_id, timeout=MAX_EXEC_TIMEOUT_SECONDS,
                             env=run.env)
    async for event in events:
        await queue.put(event)


def ended_message(request: Request, state: str) -> str:
    # E2B's SDKs word a sandbox killed under a call so, and code written for them matches it.
    return (f"the sandbox was {state} while the request was in progress "
            f"({target_of(request).sandbox_id})")


def _failure_text(request: Request, exc: BaseException) -> str:
    api = api_error_of(exc)
    if api is not None and (api.status == 409 or api.status >= 500) \
            and (state := ended_state(request)) is not None:
        return ended_message(request, state)
    if api is None:
        log.error("an E2B code run failed", exc_info=exc)
    return api.message if api is not None else "internal error"


async def _lines(request: Request, first: CodeEvent | Finished[None],
                 rest: AsyncGenerator[CodeEvent | Finished[None], None]
                 ) -> AsyncIterator[bytes]:
    item: CodeEvent | Finished[None] | None = first
    try:
        while item is not None:
            if isinstance(item, Finished):
                if item.error is not None:
                    for chunk in unexpected_end(_failure_text(request, item.error)):
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
    else:
        language = run.language or "python"
        run = dataclasses.replace(run, context_id=await _default_context(handle, language),
                                  language=language)

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
            return StreamingResponse(_lines(request, item, items), media_type=NDJSON)
    except BaseException:
        await _abandon(first, items)
        raise

    async def later() -> AsyncIterator[bytes]:
        try:
            item = await first
        except BaseException:
            await _abandon(first, items)
            raise
        async for chunk in _lines(request, item, items):
            yield chunk

    return StreamingResponse(later(), media_type=NDJSON)


@answering
async def create_context(request: Request) -> Response:
    body = await read_json(request, optional=True)
    language = language_of(body) or "python"
    cwd = optional_text(body, "cwd", MAX_CWD_CHARS) or None
    handle = await _handle(request)
    # No cwd: E2B's, the default user's home.
    data = await host_call(handle.create_code_context(language, cwd or E2B_CONTEXT_CWD))
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
