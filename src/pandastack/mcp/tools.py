"""The MCP tools: each a thin, bounded call of the async Python SDK, with a JSON schema and a
description written for a model. One code path for both transports: `opener` hands every call
an `AsyncClient` (stdio: the configured one; HTTP: one on the caller's key, in-process)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer, ResourceSecurity
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError
from mcp.types import CallToolResult, ToolAnnotations
from pydantic import Field

from pandastack import __version__
from pandastack.guestproto.ops import SEARCH_MAX_PATTERN_BYTES
from pandastack.rules import (
    MAX_EXEC_TIMEOUT_SECONDS,
    MAX_FORK,
    MAX_TTL_SECONDS,
    SANDBOX_NAME_PATTERN,
)
from pandastack.sdk import AsyncClient, AsyncSandbox, NotFoundError, PandastackError, SandboxInfo

from .results import MAX_OUTPUT_CHARS, ToolFailure, clip, from_exception, ok

__all__ = ["LIMITS", "TOOL_NAMES", "Opener", "build_server"]

#: Hands a tool call the client it acts with (and closes it, if it made one, on leaving).
Opener = Callable[[Context], AbstractAsyncContextManager[AsyncClient]]

# Every input bound is in the schemas (maxLength, maximum): the MCP layer checks each call's
# arguments against them and answers a violation with a tool error naming field and limit.
MAX_COMMAND_CHARS = 100_000
MAX_CODE_CHARS = 256 * 1024
# The content of one write: under the server's JSON body limit (1 MiB) even as base64.
MAX_WRITE_CHARS = 512 * 1024
# What read_file returns whole; larger files are read in parts with run_command.
MAX_READ_BYTES = 256 * 1024
MAX_IMAGE_READ_BYTES = 1024 * 1024
MAX_LIST_ENTRIES = 500
# Of a search's answer (the sandbox's own bounds are 1000 matches, 10 000 paths): what a
# model reads whole; past it the answer says how many there were.
MAX_SEARCH_RESULTS = 200
MAX_IMAGES = 8
MAX_PATH_CHARS = 4096
TOOL_TIMEOUT_SECONDS = 3600

LIMITS = {"command_chars": MAX_COMMAND_CHARS, "code_chars": MAX_CODE_CHARS,
          "write_chars": MAX_WRITE_CHARS, "read_bytes": MAX_READ_BYTES,
          "image_read_bytes": MAX_IMAGE_READ_BYTES, "list_entries": MAX_LIST_ENTRIES,
          "search_results": MAX_SEARCH_RESULTS,
          "output_chars": MAX_OUTPUT_CHARS}

FILE_RESOURCE = "sandbox://{sandbox_id}/files{+path}"

TOOL_NAMES = ("create_sandbox", "list_sandboxes", "run_command", "run_code", "read_file",
              "write_file", "list_files", "grep_files", "glob_files", "fork_sandbox",
              "snapshot_sandbox", "kill_sandbox", "get_url")

INSTRUCTIONS = """\
pandastack runs code in sandboxes: each is its own small Linux virtual machine (Debian, python3,
bash, internet access). Typical use: create_sandbox, then write_file / run_command / run_code
as often as needed, then kill_sandbox when done (a sandbox also ends by itself when its TTL
runs out). Use template "code-interpreter" for run_code (Python with numpy, pandas,
matplotlib; charts come back as images). Errors come back as tool errors with a code
(not_found, conflict, quota_exceeded, ...) and a message saying what to change."""

_IMAGE_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"),
                (b"GIF87a", "image/gif"), (b"GIF89a", "image/gif"))

SandboxId = Annotated[str, Field(min_length=1, max_length=64,
                                 description="the sandbox's id (sbx-...), as create_sandbox "
                                             "or list_sandboxes returned it, or its name")]
Path = Annotated[str, Field(min_length=1, max_length=MAX_PATH_CHARS,
                            description="an absolute path inside the sandbox, e.g. /work/a.py")]
Labels = Annotated[dict[str, str] | None, Field(
    default=None, max_length=64, description="string labels, e.g. {\"task\": \"t-42\"}")]


def _info(info: SandboxInfo) -> dict[str, Any]:
    return {"id": info.id, "name": info.name, "template": info.template, "state": info.state,
            "created_at": info.created_at, "expires_at": info.expires_at,
            "ttl_seconds": info.ttl_seconds, "vcpus": info.vcpus, "memory_mb": info.memory_mb,
            "metadata": info.metadata}


def _image_type(data: bytes) -> str | None:
    return next((mime for magic, mime in _IMAGE_MAGIC if data.startswith(magic)), None)


class Tools:
    """The tools' bodies; `build_server` registers them on an `MCPServer`."""

    def __init__(self, opener: Opener) -> None:
        self._opener = opener

    async def call(self, ctx: Context,
                   body: Callable[[AsyncClient], Awaitable[CallToolResult]]) -> CallToolResult:
        """Run `body` with the caller's client; every failure becomes a tool error."""
        try:
            async with self._opener(ctx) as client:
                return await body(client)
        except Exception as exc:  # the server must answer, whatever a call raised
            return from_exception(exc)

    async def sandbox(self, client: AsyncClient, sandbox_id: str) -> AsyncSandbox:
        return await client.sandboxes.connect(sandbox_id)

    async def file_resource(self, ctx: Context, sandbox_id: str, path: str) -> str | bytes:
        """A sandbox's file as a resource: text if it is UTF-8, else its bytes. Resources
        have no error results: a failure is a protocol error with the API's code."""
        try:
            async with self._opener(ctx) as client:
                sbx = await self.sandbox(client, sandbox_id)
                entry = await sbx.filesystem.stat(path)
                if entry.type == "dir":
                    raise ToolFailure("is_a_directory", f"{path} is a directory")
                if entry.size > MAX_IMAGE_READ_BYTES:
                    raise ToolFailure("too_large", _too_large(path, entry.size))
                data = await sbx.filesystem.read(path)
        except NotFoundError as exc:
            raise ResourceNotFoundError(f"not_found: {exc.message}") from exc
        except ToolFailure as exc:
            raise ResourceError(f"{exc.code}: {exc.message}") from exc
        except PandastackError as exc:
            code = getattr(exc, "code", type(exc).__name__)
            raise ResourceError(f"{code}: {getattr(exc, 'message', str(exc))}") from exc
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return data

    async def create_sandbox(self, client: AsyncClient, template: str, ttl_seconds: int | None,
                             metadata: dict[str, str] | None, env: dict[str, str] | None,
                             snapshot: str | None, name: str | None) -> CallToolResult:
        sbx = await client.sandboxes.create(template=template, ttl_seconds=ttl_seconds,
                                            metadata=metadata, env=env, snapshot=snapshot,
                                            name=name)
        return ok(_info(sbx.info))

    async def list_sandboxes(self, client: AsyncClient, state: str | None,
                             metadata: dict[str, str] | None, limit: int) -> CallToolResult:
        page = await client.sandboxes.list(state=state, metadata=metadata, limit=limit)
        return ok({"sandboxes": [_info(s.info) for s in page],
                   "more": page.next_token is not None})

    async def run_command(self, client: AsyncClient, sandbox_id: str, command: str,
                          timeout_seconds: float, cwd: str | None,
                          env: dict[str, str] | None) -> CallToolResult:
        sbx = await self.sandbox(client, sandbox_id)
        run = await sbx.exec(command, timeout_seconds=timeout_seconds, cwd=cwd, env=env)
        stdout, cut_out = clip(run.stdout)
        stderr, cut_err = clip(run.stderr)
        return ok({"exit_code": run.exit_code, "stdout": stdout, "stderr": stderr,
                   "timed_out": run.timed_out, "truncated": run.truncated or cut_out or cut_err,
                   "duration_ms": run.duration_ms})

    async def run_code(self, client: AsyncClient, sandbox_id: str, code: str,
                       language: Literal["python", "bash", "javascript"],
                       timeout_seconds: float) -> CallToolResult:
        sbx = await self.sandbox(client, sandbox_id)
        run = await sbx.run_code(code, language=language, timeout_seconds=timeout_seconds)
        stdout, cut_out = clip(run.stdout)
        stderr, cut_err = clip(run.stderr)
        results: list[dict[str, Any]] = []
        images: list[tuple[str, str]] = []
        for result in run.results:
            item: dict[str, Any] = {"is_main_result": result.is_main_result,
                                    "formats": sorted(result.data)}
            for mime in ("text/plain", "text/markdown"):
                if mime in result.data:
                    item[mime], _ = clip(result.data[mime], MAX_OUTPUT_CHARS // 5)
            for mime in ("image/png", "image/jpeg"):
                if mime in result.data and len(images) < MAX_IMAGES:
                    images.append((result.data[mime].strip(), mime))
                    item["image"] = len(images)  # its place among the image contents
            results.append(item)
        error = None
        if run.error is not None:
            error = {"name": run.error.name, "value": run.error.value,
                     "traceback": clip(run.error.traceback, MAX_OUTPUT_CHARS // 2)[0]}
        return ok({"stdout": stdout, "stderr": stderr, "results": results, "error": error,
                   "truncated": cut_out or cut_err}, images)

    async def read_file(self, client: AsyncClient, sandbox_id: str,
                        path: str) -> CallToolResult:
        sbx = await self.sandbox(client, sandbox_id)
        entry = await sbx.filesystem.stat(path)
        if entry.type == "dir":
            raise ToolFailure("is_a_directory", f"{path} is a directory: use list_files")
        if entry.size > MAX_IMAGE_READ_BYTES:
            raise ToolFailure("too_large", _too_large(path, entry.size))
        data = await sbx.filesystem.read(path)
        mime = _image_type(data)
        if mime is not None:
            return ok({"path": path, "size": len(data), "mime_type": mime},
                      [(base64.b64encode(data).decode("ascii"), mime)])
        if len(data) > MAX_READ_BYTES:
            raise ToolFailure("too_large", _too_large(path, len(data)))
        try:
            return ok({"path": path, "size": len(data), "encoding": "utf-8",
                       "content": data.decode("utf-8")})
        except UnicodeDecodeError:
            return ok({"path": path, "size": len(data), "encoding": "base64",
                       "content": base64.b64encode(data).decode("ascii")})

    async def write_file(self, client: AsyncClient, sandbox_id: str, path: str, content: str,
                         encoding: Literal["utf-8", "base64"]) -> CallToolResult:
        data: str | bytes = content
        if encoding == "base64":
            try:
                data = base64.b64decode(content, validate=True)
            except ValueError as exc:
                raise ToolFailure("invalid_argument", f"content is not valid base64: {exc}"
                                  ) from exc
        sbx = await self.sandbox(client, sandbox_id)
        written = await sbx.filesystem.write(path, data)
        return ok({"path": written.path, "size": written.size})

    async def list_files(self, client: AsyncClient, sandbox_id: str,
                         path: str) -> CallToolResult:
        sbx = await self.sandbox(client, sandbox_id)
        entries = await sbx.filesystem.list(path)
        shown = [{"name": e.name, "path": e.path, "type": e.type, "size": e.size}
                 for e in entries[:MAX_LIST_ENTRIES]]
        return ok({"path": path, "entries": shown,
                   "truncated": len(entries) > MAX_LIST_ENTRIES, "total": len(entries)})

    async def grep_files(self, client: AsyncClient, sandbox_id: str, path: str, pattern: str,
                         ignore_case: bool) -> CallToolResult:
        sbx = await self.sandbox(client, sandbox_id)
        found = await sbx.filesystem.grep(path, pattern, ignore_case)
        shown = [{"path": m.path, "line": m.line, "text": clip(m.text, 500)[0]}
                 for m in found.matches[:MAX_SEARCH_RESULTS]]
        return ok({"path": path, "matches": shown, "total": len(found.matches),
                   "truncated": found.truncated or len(found.matches) > MAX_SEARCH_RESULTS})

    async def glob_files(self, client: AsyncClient, sandbox_id: str, path: str,
                         pattern: str) -> CallToolResult:
        sbx = await self.sandbox(client, sandbox_id)
        found = await sbx.filesystem.glob(path, pattern)
        return ok({"path": path, "paths": found.paths[:MAX_SEARCH_RESULTS],
                   "total": len(found.paths),
                   "truncated": found.truncated or len(found.paths) > MAX_SEARCH_RESULTS})

    async def fork_sandbox(self, client: AsyncClient, sandbox_id: str,
                           count: int) -> CallToolResult:
        children = await (await self.sandbox(client, sandbox_id)).fork(count)
        return ok({"parent": sandbox_id, "sandboxes": [_info(c.info) for c in children]})

    async def snapshot_sandbox(self, client: AsyncClient, sandbox_id: str,
                               name: str | None) -> CallToolResult:
        snapshot = await (await self.sandbox(client, sandbox_id)).snapshot(name)
        return ok({"sandbox_id": sandbox_id, "snapshot_id": snapshot})

    async def kill_sandbox(self, client: AsyncClient, sandbox_id: str) -> CallToolResult:
        await client.sandboxes.kill(sandbox_id)
        return ok({"sandbox_id": sandbox_id, "killed": True})

    async def get_url(self, client: AsyncClient, sandbox_id: str, port: int,
                      ttl_seconds: int) -> CallToolResult:
        sbx = await self.sandbox(client, sandbox_id)
        url = await sbx.signed_url(port, ttl_seconds)
        return ok({"sandbox_id": sandbox_id, "port": port, "url": url,
                   "expires_in_seconds": ttl_seconds})


def _too_large(path: str, size: int) -> str:
    return (f"{path} is {size} bytes; read_file returns text files up to {MAX_READ_BYTES} "
            f"bytes and images up to {MAX_IMAGE_READ_BYTES}: read parts with run_command "
            "(head -c, tail -n, sed -n '1,200p'), or find lines with grep_files")


def build_server(opener: Opener, *, name: str = "pandastack") -> MCPServer:
    """An `MCPServer` with the sandbox tools, every call acting through `opener`'s client."""
    tools = Tools(opener)
    server: MCPServer = MCPServer(name, instructions=INSTRUCTIONS, log_level="WARNING",
                                  version=__version__)

    def register(fn: Callable[..., Awaitable[CallToolResult]], description: str, *,
                 read_only: bool = False, destructive: bool = False) -> None:
        server.add_tool(fn, description=description, structured_output=False,
                        annotations=ToolAnnotations(read_only_hint=read_only,
                                                    destructive_hint=destructive))

    async def create_sandbox(
            ctx: Context,
            template: Annotated[str, Field(max_length=128, description=(
                "template name: \"base\" (Debian, python3, bash), \"python\", \"node\", "
                "\"code-interpreter\" (for run_code), or one the team built"))] = "base",
            ttl_seconds: Annotated[int | None, Field(ge=1, le=MAX_TTL_SECONDS, description=(
                "seconds until the sandbox is killed automatically; default: the server's "
                "(often 300): give more for long work"))] = None,
            metadata: Labels = None,
            env: Annotated[dict[str, str] | None, Field(
                default=None, max_length=256,
                description="environment variables of every command")] = None,
            snapshot: Annotated[str | None, Field(max_length=128, description=(
                "a snapshot id from snapshot_sandbox: start from its files, memory and "
                "processes instead of a template"))] = None,
            name: Annotated[str | None, Field(pattern=SANDBOX_NAME_PATTERN, description=(
                "a name for it, unique among the team's live sandboxes; every tool then "
                "takes it in place of the id"))] = None) -> CallToolResult:
        return await tools.call(ctx, lambda c: tools.create_sandbox(
            c, template, ttl_seconds, metadata, env, snapshot, name))

    async def list_sandboxes(
            ctx: Context,
            state: Annotated[Literal["running", "paused", "hibernated", "stopped"] | None, Field(
                description="only sandboxes in this state")] = None,
            metadata: Labels = None,
            limit: Annotated[int, Field(ge=1, le=100)] = 50) -> CallToolResult:
        return await tools.call(ctx, lambda c: tools.list_sandboxes(c, state, metadata, limit))

    async def run_command(
            ctx: Context, sandbox_id: SandboxId,
            command: Annotated[str, Field(min_length=1, max_length=MAX_COMMAND_CHARS,
                                          description="a bash command line")],
            timeout_seconds: Annotated[float, Field(
                gt=0, le=min(MAX_EXEC_TIMEOUT_SECONDS, TOOL_TIMEOUT_SECONDS),
                description="kill the command after this long (timed_out is then true)")] = 60,
            cwd: Annotated[str | None, Field(max_length=MAX_PATH_CHARS,
                                             description="working directory")] = None,
            env: Annotated[dict[str, str] | None, Field(
                default=None, max_length=256, description="extra environment")] = None,
    ) -> CallToolResult:
        return await tools.call(ctx, lambda c: tools.run_command(
            c, sandbox_id, command, timeout_seconds, cwd, env))

    async def run_code(
            ctx: Context, sandbox_id: SandboxId,
            code: Annotated[str, Field(min_length=1, max_length=MAX_CODE_CHARS,
                                       description="the code to run")],
            language: Literal["python", "bash", "javascript"] = "python",
            timeout_seconds: Annotated[float, Field(gt=0, le=TOOL_TIMEOUT_SECONDS)] = 300,
    ) -> CallToolResult:
        return await tools.call(ctx, lambda c: tools.run_code(
            c, sandbox_id, code, language, timeout_seconds))

    async def read_file(ctx: Context, sandbox_id: SandboxId, path: Path) -> CallToolResult:
        return await tools.call(ctx, lambda c: tools.read_file(c, sandbox_id, path))

    async def write_file(
            ctx: Context, sandbox_id: SandboxId, path: Path,
            content: Annotated[str, Field(max_length=MAX_WRITE_CHARS, description=(
                "the whole new content of the file"))],
            encoding: Annotated[Literal["utf-8", "base64"], Field(description=(
                "\"base64\" for binary content"))] = "utf-8") -> CallToolResult:
        return await tools.call(ctx, lambda c: tools.write_file(
            c, sandbox_id, path, content, encoding))

    async def list_files(ctx: Context, sandbox_id: SandboxId, path: Path) -> CallToolResult:
        return await tools.call(ctx, lambda c: tools.list_files(c, sandbox_id, path))

    async def grep_files(
            ctx: Context, sandbox_id: SandboxId, path: Path,
            pattern: Annotated[str, Field(min_length=1, max_length=SEARCH_MAX_PATTERN_BYTES,
                                          description="literal text within one line (not a "
                                                      "regular expression)")],
            ignore_case: bool = False) -> CallToolResult:
        return await tools.call(ctx, lambda c: tools.grep_files(
            c, sandbox_id, path, pattern, ignore_case))

    async def glob_files(
            ctx: Context, sandbox_id: SandboxId, path: Path,
            pattern: Annotated[str, Field(min_length=1, max_length=SEARCH_MAX_PATTERN_BYTES,
                                          description="relative to path, e.g. **/*.py")],
    ) -> CallToolResult:
        return await tools.call(ctx, lambda c: tools.glob_files(c, sandbox_id, path, pattern))

    async def fork_sandbox(
            ctx: Context, sandbox_id: SandboxId,
            count: Annotated[int, Field(ge=1, le=MAX_FORK)] = 1) -> CallToolResult:
        return await tools.call(ctx, lambda c: tools.fork_sandbox(c, sandbox_id, count))

    async def snapshot_sandbox(
            ctx: Context, sandbox_id: SandboxId,
            name: Annotated[str | None, Field(max_length=128)] = None) -> CallToolResult:
        return await tools.call(ctx, lambda c: tools.snapshot_sandbox(c, sandbox_id, name))

    async def kill_sandbox(ctx: Context, sandbox_id: SandboxId) -> CallToolResult:
        return await tools.call(ctx, lambda c: tools.kill_sandbox(c, sandbox_id))

    async def get_url(
            ctx: Context, sandbox_id: SandboxId,
            port: Annotated[int, Field(ge=1, le=65535, description=(
                "the TCP port a server inside the sandbox listens on"))],
            ttl_seconds: Annotated[int, Field(ge=60, le=7 * 24 * 3600)] = 3600,
    ) -> CallToolResult:
        return await tools.call(ctx, lambda c: tools.get_url(c, sandbox_id, port, ttl_seconds))

    @server.resource(FILE_RESOURCE, name="sandbox_file",
                     description="a file inside a sandbox, e.g. "
                                 "sandbox://sbx-0123456789ab/files/work/out.csv (text if "
                                 f"UTF-8, else bytes; up to {MAX_IMAGE_READ_BYTES} bytes)",
                     # A path inside the sandbox may be absolute or climb: the VM, not
                     # this server, is what the path can reach.
                     security=ResourceSecurity(exempt_params={"path"}))
    async def sandbox_file(sandbox_id: str, path: str, ctx: Context) -> str | bytes:
        return await tools.file_resource(ctx, sandbox_id, path)

    register(create_sandbox, "Create a sandbox (a fresh Linux VM) and return its id and "
             "details. Kill it with kill_sandbox when done.")
    register(list_sandboxes, "List this team's live sandboxes (id, template, state, expiry, "
             "metadata).", read_only=True)
    register(run_command, "Run a bash command line in a sandbox and wait for it. Returns "
             "exit_code, stdout, stderr, timed_out, and truncated (true when output was cut "
             f"to {MAX_OUTPUT_CHARS} characters per stream).")
    register(run_code, "Run code in the sandbox's Jupyter kernel (template "
             "\"code-interpreter\"); state persists between calls. Returns stdout, stderr, "
             "results (the last expression's value, as text), and error (name, value, "
             "traceback) if the code raised; charts (matplotlib) come back as PNG images.")
    register(read_file, f"Read a file from a sandbox: UTF-8 text (base64 if binary), up to "
             f"{MAX_READ_BYTES} bytes; PNG, JPEG and GIF files come back as images.",
             read_only=True)
    register(write_file, "Create or replace a file in a sandbox (parent directories are "
             f"made). Content up to {MAX_WRITE_CHARS} characters.")
    register(list_files, "List a directory in a sandbox: name, path, type (file, dir, "
             f"symlink) and size of each entry (at most {MAX_LIST_ENTRIES}).", read_only=True)
    register(grep_files, "Find the lines holding a literal text in the files under a path "
             "in a sandbox (recursive; binary files skipped): path, line (from 1) and text "
             f"of each, at most {MAX_SEARCH_RESULTS}.", read_only=True)
    register(glob_files, "Find the paths under a directory in a sandbox that a pattern "
             "matches: * and ? within one name, ** any number of directories (e.g. "
             f"**/*.py); sorted, at most {MAX_SEARCH_RESULTS}.", read_only=True)
    register(fork_sandbox, "Make live copies of a sandbox (memory, processes, files as of "
             "now), e.g. to try several approaches from one state. Returns the new sandboxes; "
             "kill each when done.")
    register(snapshot_sandbox, "Save a sandbox's memory, processes and files as a snapshot "
             "(the sandbox keeps running); create_sandbox(snapshot=id) starts from it.")
    register(kill_sandbox, "Kill a sandbox and delete its state. Idempotent.",
             destructive=True)
    register(get_url, "A public URL of a TCP port inside a sandbox (e.g. a web server "
             "started with run_command), valid for ttl_seconds without any key.",
             read_only=True)
    return server


@asynccontextmanager
async def shared(client: AsyncClient) -> AsyncIterator[AsyncClient]:
    """An opener's body that lends one long-lived client (stdio) without closing it."""
    yield client
