"""E2B's `process.Process` service (spec/envd/process/process.proto) over our processes.

- `Start` is our background process followed on the same guest call (`spawn_attach`: the
  pid first, then its output), or `pty_create` then `pty_connect` with a PTY: `start {pid}`,
  then `data` events
  (stdout, stderr or pty bytes, base64 in JSON), then `end`. As in E2B's daemon, the process
  does not depend on the stream: a client that goes away detaches, the process runs on until
  it exits or its deadline (the call's `Connect-Timeout-Ms`, which E2B's SDKs set from a
  command's `timeout`) kills it; `Connect` follows it again. A quiet stream gets a
  `keepalive` event every `Keepalive-Ping-Interval` seconds.
- `stdin: false` (what newer SDKs send unless asked) closes stdin at once, as E2B's daemon
  starts such a process with none; true (or absent, the proto's default) keeps it open.
- The user is the Basic auth name, else E2B's default `user`; the working directory is the
  request's, else the template's WORKDIR, else the user's home (E2B's default: `/root` or
  `/home/<name>`, as the room's files take it; a shell's `cd "$HOME"` where the image has no
  such directory); the environment the sandbox's (its template's ENV and the create's env)
  under the request's.
- `Connect` replays what the guest's rings hold of the process's output (the last 1 MiB of
  each stream) before it follows it live, where E2B's daemon sends only what comes after.
- Processes are selected by pid or by the `tag` given at start; the tags and the configs
  `List` reports are kept by this server (a process that another server started, or that our
  own API started, lists with its command line as `cmd`). Only running processes are
  selected: an exited one is `not_found`, as in E2B's daemon.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import signal as signals
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from pandastack.hostport.errors import GuestOSError
from pandastack.hostport.protocols import SandboxPort
from pandastack.hostport.pty import PtyExit, check_dims
from pandastack.hostport.results import ExecResult
from pandastack.server.routes.deps import check_text
from pandastack.server.sandboxes.service import SandboxService
from pandastack.server.web.errors import clean_text

from ..target import DEFAULT_USER, SandboxTarget, target_of
from .connect import ClientStream, ConnectError, Message, Method, ServerStream, Unary
from .guestfs import USER_NAME, home_of
from .protojson import as_bytes as _bytes
from .protojson import as_object as _object
from .protojson import as_string as _string
from .protojson import as_uint as _uint
from .protojson import invalid as _invalid

KEEPALIVE_HEADER = "keepalive-ping-interval"
TIMEOUT_HEADER = "connect-timeout-ms"
DEFAULT_KEEPALIVE_SECONDS = 50.0
QUEUE_ITEMS = 64
MAX_ARGS = 4096
MAX_PROCESSES_REMEMBERED = 256  # per sandbox
MAX_SANDBOXES_REMEMBERED = 4096
HOME_MISSING = ("ENOENT", "ENOTDIR", "EACCES")
"""What the guest answers for a home directory it cannot start a process in."""
# Connect's JSON names E2B's Signal enum by name; numbers are accepted too.
SIGNALS = {"SIGNAL_SIGTERM": signals.SIGTERM, "SIGNAL_SIGKILL": signals.SIGKILL}


# -- what this server remembers of the processes it started ---------------------------------

@dataclass
class Started:
    config: Message
    tag: str | None
    pty: bool
    expired: bool = False  # its deadline killed it


@dataclass
class Registry:
    """Per sandbox: pid -> what it was started with (for List and tag selectors). Bounded,
    oldest first out: entries of exited processes go when List or a selector meets them,
    those of sandboxes that ended only by these bounds."""

    by_sandbox: dict[str, dict[int, Started]] = field(default_factory=dict)

    def of(self, sandbox_id: str) -> dict[int, Started]:
        found = self.by_sandbox.pop(sandbox_id, None)
        if found is None:
            found = {}
            while len(self.by_sandbox) >= MAX_SANDBOXES_REMEMBERED:
                del self.by_sandbox[next(iter(self.by_sandbox))]
        self.by_sandbox[sandbox_id] = found  # the most recently used last
        return found

    def add(self, sandbox_id: str, pid: int, started: Started) -> None:
        processes = self.of(sandbox_id)
        processes.pop(pid, None)
        while len(processes) >= MAX_PROCESSES_REMEMBERED:
            del processes[next(iter(processes))]
        processes[pid] = started


_REGISTRIES: weakref.WeakKeyDictionary[SandboxService, Registry] = weakref.WeakKeyDictionary()


def registry(service: SandboxService) -> Registry:
    found = _REGISTRIES.get(service)
    if found is None:
        found = _REGISTRIES[service] = Registry()
    return found


# -- reading requests --------------------------------------------------------------------

def _config(message: Message) -> tuple[list[str], dict[str, str], str | None, Message]:
    """(argv, envs, cwd, the config as List reports it) of a StartRequest's `process`."""
    config = _object(message.get("process"), "process")
    cmd = _string(config.get("cmd"), "process.cmd")
    if not cmd:
        raise _invalid("process.cmd is required")
    args = config.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise _invalid("process.args must be a list of strings")
    if len(args) > MAX_ARGS:
        raise _invalid(f"process.args: at most {MAX_ARGS}")
    envs = _object(config.get("envs"), "process.envs")
    if not all(isinstance(v, str) for v in envs.values()):
        raise _invalid("process.envs must map strings to strings")
    cwd = _string(config.get("cwd"), "process.cwd") or None
    check_text([cmd, *args], "process.cmd and args")
    check_text(envs, "process.envs")
    check_text(cwd, "process.cwd")
    shown: Message = {"cmd": cmd, "args": list(args), "envs": dict(envs)}
    if cwd is not None:
        shown["cwd"] = cwd
    return [cmd, *args], envs, cwd, shown


def _pty_size(message: Message) -> tuple[int, int] | None:
    pty = message.get("pty")
    if pty is None:
        return None
    size = _object(_object(pty, "pty").get("size"), "pty.size")
    cols, rows = _uint(size.get("cols", 0), "pty.size.cols"), _uint(size.get("rows", 0),
                                                                      "pty.size.rows")
    try:
        check_dims(cols, rows)
    except ValueError as exc:
        raise _invalid(str(exc)) from None
    return cols, rows


def _seconds(request: Request, header: str, default: float | None) -> float | None:
    value = request.headers.get(header)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        raise _invalid(f"{header} must be a number") from None
    if number != number or number < 0:
        raise _invalid(f"{header} must be a number >= 0")
    return number


def _home_cwd(argv: list[str], relative: str = "") -> list[str]:
    """`argv` run from the user's home directory (E2B's default working directory), or from
    `relative` under it (E2B's daemon reads a relative `cwd` from the home): the guest sets
    HOME from the passwd entry of the user it runs the process as; `exec` keeps the pid."""
    script = 'cd "$HOME" 2>/dev/null; if [ -n "$1" ]; then cd -- "$1" || exit 1; fi; shift; ' \
        'exec "$@"'
    return ["/bin/sh", "-c", script, "sh", relative, *argv]


# -- finding a process ---------------------------------------------------------------------

async def _sandbox(request: Request) -> tuple[SandboxTarget, SandboxPort]:
    target = target_of(request)
    _, handle = await target.service.running(target.team, target.sandbox_id)
    return target, handle


async def _running(target: SandboxTarget, handle: SandboxPort) -> dict[int, dict[str, Any]]:
    running: dict[int, dict[str, Any]] = {}
    for item in await target.service.host_call(handle.procs()):
        pid = item.get("pid")
        if isinstance(pid, int) and item.get("running"):
            running[pid] = item
    return running


async def _select(target: SandboxTarget, handle: SandboxPort, message: Message
                  ) -> tuple[int, bool]:
    """(pid, has a terminal) of the running process `message["process"]` selects."""
    selector = _object(message.get("process"), "process")
    started = registry(target.service).of(target.sandbox_id)
    if selector.get("pid") is not None:
        pid = _uint(selector["pid"], "process.pid")
    elif selector.get("tag") is not None:
        tag = _string(selector["tag"], "process.tag")
        pids = [p for p, s in started.items() if s.tag == tag]
        if not pids:
            raise ConnectError("not_found", f"process with tag {tag!r} not found")
        pid = pids[-1]
    else:
        raise _invalid("process: a pid or a tag")
    running = await _running(target, handle)
    if pid not in running:
        started.pop(pid, None)
        raise ConnectError("not_found", f"process with pid {pid} not found")
    return pid, bool(running[pid].get("tty"))


# -- streams --------------------------------------------------------------------------------

Event = Message | None  # None: the output ended (an `end` event was queued before it)


def _data(kind: str, chunk: bytes) -> Message:
    return {"event": {"data": {kind: base64.b64encode(chunk).decode("ascii")}}}


def _end(exit_code: int, signal: int | None, error: str | None = None) -> Message:
    if signal:
        try:
            name = signals.Signals(signal).name[3:].lower()
        except ValueError:
            name = str(signal)
        end: Message = {"exitCode": -1, "exited": False, "status": f"signal: {name}"}
    else:
        end = {"exitCode": exit_code, "exited": True, "status": f"exit status {exit_code}"}
    if error:
        end["error"] = error
    return {"event": {"end": end}}


def _expired(what: str, killed: bool = True) -> ConnectError:
    # E2B's daemon ends the call at its deadline (deadline_exceeded, the SDKs' timeout
    # error) as it kills the process: an `end` event would read as a failed command
    return ConnectError("deadline_exceeded", f"{what}: the call's timeout (Connect-Timeout-Ms) "
                        "passed" + ("; its deadline killed the process" if killed else ""))


async def _follow_output(handle: SandboxPort, pid: int,
                         put: Callable[[Message], Awaitable[None]]) -> None:
    async def on_stdout(chunk: bytes) -> None:
        await put(_data("stdout", chunk))

    async def on_stderr(chunk: bytes) -> None:
        await put(_data("stderr", chunk))

    result: ExecResult = await handle.attach(pid, on_stdout=on_stdout, on_stderr=on_stderr,
                                             keep_output=False)
    await _ended(result, f"process {pid}", put)


async def _ended(result: ExecResult, what: str,
                 put: Callable[[Message], Awaitable[None]]) -> None:
    if result.timed_out:
        raise _expired(what)
    await put(_end(result.exit_code, result.signal))


async def _follow_pty(handle: SandboxPort, pid: int,
                      put: Callable[[Message], Awaitable[None]],
                      started: Started | None = None) -> None:
    session = await handle.pty_connect(pid)
    try:
        while True:
            item = await session.receive()
            if isinstance(item, PtyExit):
                if started is not None and started.expired:
                    raise _expired(f"terminal {pid}")
                await put(_end(item.exit_code, item.signal))
                return
            await put(_data("pty", item))
    finally:
        with contextlib.suppress(Exception):
            await session.close()


def _start(pid: int) -> Message:
    return {"event": {"start": {"pid": pid}}}


async def _events(request: Request, pid: int | None,
                  follow: Callable[[Callable[[Message], Awaitable[None]]], Awaitable[None]]
                  ) -> AsyncIterator[Message]:
    """`start`, then what `follow` puts, with keepalives while it is quiet; leaving the
    stream stops following (the process runs on). Without `pid`, `follow` puts the `start`
    itself (it learns the pid as the process starts); no keepalive goes before it."""
    interval = _seconds(request, KEEPALIVE_HEADER, DEFAULT_KEEPALIVE_SECONDS)
    interval = max(1.0, min(interval or DEFAULT_KEEPALIVE_SECONDS, 3600.0))
    timeout_ms = _seconds(request, TIMEOUT_HEADER, None)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_ms / 1000 if timeout_ms else None
    queue: asyncio.Queue[Event] = asyncio.Queue(QUEUE_ITEMS)

    async def run() -> None:
        try:
            await follow(queue.put)
        finally:
            await queue.put(None)

    task = asyncio.create_task(run())
    started = pid is not None
    try:
        if pid is not None:
            yield _start(pid)
        while True:
            wait = interval if deadline is None else min(interval, deadline - loop.time())
            try:
                item = await asyncio.wait_for(queue.get(), max(0.0, wait))
            except TimeoutError:
                if deadline is not None and loop.time() >= deadline:
                    what = f"the stream of process {pid}" if pid else "the process's stream"
                    raise _expired(what, killed=False) from None
                if started:
                    yield {"event": {"keepalive": {}}}
                continue
            started = True
            if item is None:
                break
            yield item
        await task  # what it raised ends the stream with that error
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


# -- the methods ---------------------------------------------------------------------------

async def start(request: Request, message: Message) -> AsyncIterator[Message]:
    argv, envs, cwd, shown = _config(message)
    size = _pty_size(message)
    tag = _string(message.get("tag"), "tag")
    stdin = message.get("stdin", True)
    if not isinstance(stdin, bool):
        raise _invalid("stdin must be a boolean")
    timeout = _seconds(request, TIMEOUT_HEADER, None)
    target = target_of(request)
    row, handle = await target.service.running(target.team, target.sandbox_id)
    # the request's directory, else the template's WORKDIR, else the user's home: as E2B's
    # daemon takes its template's default workdir before the home
    relative = ""
    if cwd is not None and not cwd.startswith("/"):
        relative, cwd = cwd, None
    env, cwd, _ = target.service.call_context(row, envs, cwd)
    if relative:
        cwd = None
    user = target.user or DEFAULT_USER
    command = argv if cwd is not None else _home_cwd(argv, relative)
    # the home by the images' convention, without the wrapper's extra exec of a shell (~10 ms
    # of a start under TCG); where the image has no such directory, the wrapper after all
    home = home_of(user) if cwd is None and not relative and USER_NAME.match(user) else None
    # a command running, as our exec stream counts one; taken before it starts, so that a
    # refusal leaves nothing running that no one knows of
    release = target.service.exec_slots.acquire(target.team)
    try:
        if size is None:
            # one guest call: the process starts, its pid comes first, then its output
            async def spawn_and_follow(put: Callable[[Message], Awaitable[None]]) -> None:
                async def spawned(pid: int) -> None:
                    registry(target.service).add(target.sandbox_id, pid,
                                                 Started(shown, tag, False))
                    await put(_start(pid))

                async def on_stdout(chunk: bytes) -> None:
                    await put(_data("stdout", chunk))

                async def on_stderr(chunk: bytes) -> None:
                    await put(_data("stderr", chunk))

                def start_in(run: list[str], at: str | None) -> Awaitable[ExecResult]:
                    return handle.spawn_attach(
                        run, on_spawned=spawned, env=env, cwd=at, user=user,
                        timeout=timeout / 1000 if timeout else None, stdin=stdin,
                        on_stdout=on_stdout, on_stderr=on_stderr, keep_output=False)

                async def run_it() -> ExecResult:
                    if home is not None:
                        try:
                            return await start_in(argv, home)
                        except GuestOSError as exc:
                            # nothing started: the guest refused the directory itself
                            if exc.path != home or exc.errno_name not in HOME_MISSING:
                                raise
                    return await start_in(command, cwd)

                await _ended(await target.service.host_call(run_it()), "the process", put)

            async for event in _events(request, None, spawn_and_follow):
                yield event
            return
        pid = await target.service.host_call(handle.pty_create(
            cols=size[0], rows=size[1], cmd=command, env=env, cwd=cwd, user=user))
        started = Started(shown, tag, True)
        registry(target.service).add(target.sandbox_id, pid, started)
        if timeout:
            _deadline(target, handle, pid, started, timeout / 1000)

        async def follow_it(put: Callable[[Message], Awaitable[None]]) -> None:
            await _follow_pty(handle, pid, put, started)

        async for event in _events(request, pid, follow_it):
            yield event
    finally:
        release()


_DEADLINES: set[asyncio.Task[None]] = set()


def _deadline(target: SandboxTarget, handle: SandboxPort, pid: int, started: Started,
              seconds: float) -> None:
    """Kill terminal `pid` after `seconds`, as E2B's daemon ends a PTY at its timeout (our
    terminals have no deadline of their own; a background process's is the guest's)."""
    async def kill() -> None:
        await asyncio.sleep(seconds)
        if registry(target.service).of(target.sandbox_id).get(pid) is not started:
            return  # gone, and the pid perhaps another's now
        with contextlib.suppress(Exception):
            if pid in await _running(target, handle):
                started.expired = True
                await handle.signal(pid, signals.SIGKILL)

    task = asyncio.create_task(kill())
    _DEADLINES.add(task)  # held until done: the loop keeps only weak references
    task.add_done_callback(_DEADLINES.discard)


async def connect(request: Request, message: Message) -> AsyncIterator[Message]:
    target, handle = await _sandbox(request)
    pid, tty = await _select(target, handle, message)
    started = registry(target.service).of(target.sandbox_id).get(pid)

    async def follow_it(put: Callable[[Message], Awaitable[None]]) -> None:
        if tty:
            await _follow_pty(handle, pid, put, started)
        else:
            await _follow_output(handle, pid, put)

    # following a running process, as our process stream counts one
    release = target.service.stream_slots.acquire(target.team)
    try:
        async for event in _events(request, pid, follow_it):
            yield event
    finally:
        release()


async def list_processes(request: Request, message: Message) -> Message:
    target, handle = await _sandbox(request)
    started = registry(target.service).of(target.sandbox_id)
    running = await _running(target, handle)
    for pid in [p for p in started if p not in running]:
        del started[pid]  # exited: E2B's daemon forgets them too
    processes = []
    for pid, item in sorted(running.items()):
        known = started.get(pid)
        if known is not None:
            info: Message = {"pid": pid, "config": known.config}
            if known.tag is not None:
                info["tag"] = known.tag
        else:
            cmd = item.get("cmd")
            info = {"pid": pid, "config": {
                "cmd": clean_text(cmd if isinstance(cmd, str) else str(cmd)),
                "args": [], "envs": {}}}
        processes.append(info)
    return {"processes": processes}


async def _send(target: SandboxTarget, handle: SandboxPort, pid: int, tty: bool,
                given: Message) -> None:
    """One ProcessInput: `stdin` bytes to a process's pipe, `pty` bytes to its terminal."""
    if given.get("pty") is not None:
        data = _bytes(given["pty"], "input.pty")
        if not tty:
            raise ConnectError("failed_precondition", f"process {pid} has no terminal")
        session = await target.service.host_call(handle.pty_connect(pid))
        try:
            await target.service.host_call(session.send(data))
        finally:
            with contextlib.suppress(Exception):
                await session.close()
    elif given.get("stdin") is not None:
        data = _bytes(given["stdin"], "input.stdin")
        if tty:
            raise ConnectError("failed_precondition",
                               f"process {pid} has a terminal: send its input as pty")
        await target.service.host_call(handle.send_stdin(pid, data))
    else:
        raise _invalid("input: stdin or pty bytes")


async def send_input(request: Request, message: Message) -> Message:
    target, handle = await _sandbox(request)
    pid, tty = await _select(target, handle, message)
    await _send(target, handle, pid, tty, _object(message.get("input"), "input"))
    return {}


async def stream_input(request: Request, messages: AsyncIterator[Message]) -> Message:
    target, handle = await _sandbox(request)
    selected: tuple[int, bool] | None = None
    async for message in messages:
        event = _object(message.get("event", message), "event")
        if event.get("start") is not None:
            if selected is not None:
                raise _invalid("one start event per stream")
            selected = await _select(target, handle, _object(event["start"], "start"))
        elif event.get("data") is not None:
            if selected is None:
                raise _invalid("the stream begins with a start event")
            data = _object(event["data"], "data")
            await _send(target, handle, *selected, _object(data.get("input"), "input"))
        elif event.get("keepalive") is None:
            raise _invalid("event: start, data or keepalive")
    if selected is None:
        raise _invalid("the stream begins with a start event")
    return {}


async def send_signal(request: Request, message: Message) -> Message:
    target, handle = await _sandbox(request)
    value = message.get("signal")
    number = SIGNALS.get(value) if isinstance(value, str) else None
    if number is None and isinstance(value, int) and not isinstance(value, bool) and \
            value in SIGNALS.values():
        number = signals.Signals(value)
    if number is None:
        raise _invalid("signal: SIGNAL_SIGTERM or SIGNAL_SIGKILL")
    pid, _ = await _select(target, handle, message)
    await target.service.host_call(handle.signal(pid, int(number)))
    return {}


async def close_stdin(request: Request, message: Message) -> Message:
    target, handle = await _sandbox(request)
    pid, tty = await _select(target, handle, message)
    if tty:
        raise ConnectError("failed_precondition",
                           f"process {pid} has a terminal: send Ctrl-D (0x04) as its input")
    await target.service.host_call(handle.send_stdin(pid, b"", eof=True))
    return {}


async def update(request: Request, message: Message) -> Message:
    target, handle = await _sandbox(request)
    size = _pty_size(message)
    pid, tty = await _select(target, handle, message)
    if size is None:
        return {}
    if not tty:
        raise ConnectError("failed_precondition", f"process {pid} has no terminal")
    session = await target.service.host_call(handle.pty_connect(pid))
    try:
        await target.service.host_call(session.resize(*size))
    finally:
        with contextlib.suppress(Exception):
            await session.close()
    return {}


METHODS: dict[str, Method] = {
    "Start": ServerStream(start),
    "Connect": ServerStream(connect),
    "List": Unary(list_processes),
    "SendInput": Unary(send_input),
    "StreamInput": ClientStream(stream_input),
    "SendSignal": Unary(send_signal),
    "CloseStdin": Unary(close_stdin),
    "Update": Unary(update),
}
