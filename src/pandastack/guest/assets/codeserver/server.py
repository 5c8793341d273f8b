"""The socket server: one request per connection, dispatched to the code contexts."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import sys
from typing import Any

from . import protocol
from .javascript import NodeContext
from .protocol import (
    ALIASES,
    DEFAULT_CWD,
    ENV_NAME,
    LANGUAGES,
    MAX_CONTEXTS,
    MAX_ENV,
    MAX_REQUEST_LINE,
    SOCKET_PATH,
    Context,
    Failure,
    Output,
    Run,
    log,
)
from .python_kernel import PythonContext
from .shell import BashContext

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
    p = argparse.ArgumentParser(description="pandastack code interpreter server")
    p.add_argument("--socket", default=SOCKET_PATH)
    p.add_argument("--cwd", default=DEFAULT_CWD, help="working directory of default contexts")
    args = p.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="kernel-server[%(process)d] %(levelname)s %(message)s")
    protocol.RUN_DIR = os.path.join(os.path.dirname(os.path.abspath(args.socket)), "code")
    # Connection files of the kernels belong on tmpfs, not in the image's /root.
    os.environ.setdefault("JUPYTER_RUNTIME_DIR", protocol.RUN_DIR)
    asyncio.run(serve(args.socket, args.cwd))
    return 0
