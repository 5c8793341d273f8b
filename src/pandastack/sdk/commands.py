"""`sbx.commands`: run commands to completion, or start processes and drive them.

`Commands`/`Process` are the sync twins, `AsyncCommands`/`AsyncProcess` the async ones; both send
calls built in `_base`, so they differ only in `await`.
"""

from __future__ import annotations

import builtins
import contextlib
import inspect
import signal as _signal
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence

from pandastack.sdk import _base, _commands, _streams
from pandastack.sdk._http import HTTP, AsyncHTTP
from pandastack.sdk._streams import ProcessEvent
from pandastack.sdk.errors import TransportTimeoutError, WaitTimeoutError
from pandastack.sdk.models import AsyncOutputCallback, ExecResult, OutputCallback, ProcessInfo

__all__ = ["AsyncCommands", "AsyncProcess", "Commands", "Process"]


class Commands(_base.NamespaceBase[HTTP]):
    """Commands of one sandbox (`sbx.commands`)."""

    def run(self, cmd: str | Sequence[str], timeout_seconds: float = 60,
            env: Mapping[str, str] | None = None, cwd: str | None = None,
            stdin: str | None = None, on_stdout: OutputCallback | None = None,
            on_stderr: OutputCallback | None = None,
            max_output_bytes: int | None = None) -> ExecResult:
        """Run `cmd` to completion and return its `ExecResult`.

        `cmd` is a shell command line (a string) or an argv list. The command is killed after
        `timeout_seconds` (then `timed_out` is true); the HTTP read timeout is set above that, so
        long commands are never cut by the client. With `on_stdout`/`on_stderr` the output is
        streamed: each callback gets every chunk of text as it arrives, and the result still
        holds the whole output.
        """
        streaming = on_stdout is not None or on_stderr is not None
        call = _commands.exec_call(self._sandbox_id, cmd, timeout_seconds=timeout_seconds, env=env,
                               cwd=cwd, stdin=stdin, stream=streaming,
                               base_timeout=self._http.timeout,
                               max_output_bytes=max_output_bytes)
        if not streaming:
            return self._http.run(call)
        decoder = _commands.ExecStreamDecoder()
        with self._http.stream(call) as response:
            for chunk in response.iter_bytes():
                _deliver(decoder.feed(chunk), on_stdout, on_stderr)
                if decoder.done:
                    break
            else:
                _deliver(decoder.close(), on_stdout, on_stderr)
        return decoder.result()

    def start(self, cmd: str | Sequence[str], env: Mapping[str, str] | None = None,
              cwd: str | None = None, timeout_seconds: float | None = None,
              on_stdout: OutputCallback | None = None,
              on_stderr: OutputCallback | None = None) -> Process:
        """Start `cmd` in the background and return a `Process` handle to drive it.

        Its output is kept in the sandbox (the last 1 MiB of each stream) until someone reads
        it: `Process.stream()` replays that, then follows live. `on_stdout`/`on_stderr` get
        each chunk as `stream()` or `wait()` reads it. With `timeout_seconds` the process
        (its whole cgroup) is killed after that long; its result then has `timed_out`.
        """
        info = self._http.run(_commands.start_process_call(
            self._sandbox_id, cmd, env=env, cwd=cwd, timeout_seconds=timeout_seconds))
        return Process(self._sandbox_id, info, self._http, on_stdout, on_stderr)

    def connect(self, pid: int, on_stdout: OutputCallback | None = None,
                on_stderr: OutputCallback | None = None) -> Process:
        """A handle on background process `pid`, e.g. one another client started: its
        `stream()` replays what the sandbox still holds of its output, then follows it live.
        `NotFoundError` if the sandbox knows no such process (running, or among the last 64
        that ended)."""
        info = _streams.find_process(self.list(), pid)
        return Process(self._sandbox_id, info, self._http, on_stdout, on_stderr)

    def list(self) -> builtins.list[ProcessInfo]:
        """The processes started with `start()` that the sandbox still knows about."""
        return self._http.run(_commands.list_processes_call(self._sandbox_id))


class Process(_base.ProcessBase[HTTP]):
    """A background process started by `sbx.commands.start()` (or found by `connect()`)."""

    def stream(self, timeout_seconds: float | None = None) -> Iterator[ProcessEvent]:
        """The process's output as `ProcessEvent`s: a `dropped` event if the sandbox's buffer
        already lost the start of it, the buffered output (all of stdout, then all of
        stderr), then live chunks as the process writes them, then one `exit` event (its
        `result`). Each chunk also goes to the `on_stdout`/`on_stderr` callbacks. Leaving the
        loop early detaches; the process keeps running. With `timeout_seconds`, stop with
        `WaitTimeoutError` after about that long (the process keeps running)."""
        decoder = _streams.ProcessStreamDecoder()
        call = _streams.stream_call(self._sandbox_id, self.pid, base_timeout=self._http.timeout,
                                    timeout_seconds=timeout_seconds)
        deadline = _deadline(timeout_seconds)
        with _waited(self.pid, timeout_seconds), self._http.stream(call) as response:
            for chunk in response.iter_bytes():
                for event in decoder.feed(chunk):
                    self._hand_out(event)
                    yield event
                if decoder.done:
                    return
                _check(deadline, self.pid, timeout_seconds)
            for event in decoder.close():
                self._hand_out(event)
                yield event
        decoder.result()  # ProtocolError: the stream ended before the exit

    def wait(self, timeout_seconds: float | None = None) -> ExecResult:
        """Wait for the process to exit and return its result (its whole output, as far as
        the sandbox's buffer still holds it).

        With `timeout_seconds`, give up waiting after that long (`WaitTimeoutError`). With
        `on_stdout`/`on_stderr` callbacks the output is streamed to them meanwhile.
        """
        if any(self._on_output.values()):
            result: ExecResult | None = None
            for event in self.stream(timeout_seconds):
                result = event.result if event.type == "exit" else result
            assert result is not None
            return result
        return self._http.run(_commands.wait_call(self._sandbox_id, self.pid,
                                              timeout_seconds=timeout_seconds,
                                              base_timeout=self._http.timeout))

    def _hand_out(self, event: ProcessEvent) -> None:
        callback = self._on_output.get(event.type)
        if callback is not None:
            callback(event.data)

    def send_signal(self, sig: int) -> None:
        """Send signal `sig` (a number or a `signal.Signals`) to the process."""
        self._http.run(_commands.signal_call(self._sandbox_id, self.pid, sig))

    def kill(self) -> None:
        """Kill the process (SIGKILL)."""
        self.send_signal(_signal.SIGKILL)

    def send_stdin(self, data: str | bytes, eof: bool = False) -> None:
        """Write `data` (str is sent as UTF-8) to the process's stdin; `eof=True` closes it."""
        self._http.run(_commands.send_stdin_call(self._sandbox_id, self.pid, data, eof=eof))


class AsyncCommands(_base.NamespaceBase[AsyncHTTP]):
    """Commands of one sandbox (`sbx.commands`), async."""

    async def run(self, cmd: str | Sequence[str], timeout_seconds: float = 60,
                  env: Mapping[str, str] | None = None, cwd: str | None = None,
                  stdin: str | None = None, on_stdout: AsyncOutputCallback | None = None,
                  on_stderr: AsyncOutputCallback | None = None,
                  max_output_bytes: int | None = None) -> ExecResult:
        """Run `cmd` to completion and return its `ExecResult`.

        `cmd` is a shell command line (a string) or an argv list. The command is killed after
        `timeout_seconds` (then `timed_out` is true); the HTTP read timeout is set above that, so
        long commands are never cut by the client. With `on_stdout`/`on_stderr` (plain or async
        functions) the output is streamed: each callback gets every chunk of text as it
        arrives, and the result still holds the whole output. `max_output_bytes` bounds
        what the result keeps (streamed: what is sent) of each of stdout and stderr; past it
        `truncated` is true. Default, and the most a request may ask for: the server's
        PANDASTACK_MAX_EXEC_OUTPUT_MB (64 MiB unless set).
        """
        streaming = on_stdout is not None or on_stderr is not None
        call = _commands.exec_call(self._sandbox_id, cmd, timeout_seconds=timeout_seconds, env=env,
                               cwd=cwd, stdin=stdin, stream=streaming,
                               base_timeout=self._http.timeout,
                               max_output_bytes=max_output_bytes)
        if not streaming:
            return await self._http.run(call)
        decoder = _commands.ExecStreamDecoder()
        async with self._http.stream(call) as response:
            async for chunk in response.aiter_bytes():
                await _adeliver(decoder.feed(chunk), on_stdout, on_stderr)
                if decoder.done:
                    break
            else:
                await _adeliver(decoder.close(), on_stdout, on_stderr)
        return decoder.result()

    async def start(self, cmd: str | Sequence[str], env: Mapping[str, str] | None = None,
                    cwd: str | None = None, timeout_seconds: float | None = None,
                    on_stdout: AsyncOutputCallback | None = None,
                    on_stderr: AsyncOutputCallback | None = None) -> AsyncProcess:
        """Start `cmd` in the background and return an `AsyncProcess` handle to drive it.

        Its output is kept in the sandbox (the last 1 MiB of each stream) until someone reads
        it: `AsyncProcess.stream()` replays that, then follows live. `on_stdout`/`on_stderr`
        (plain or async functions) get each chunk as `stream()` or `wait()` reads it. With
        `timeout_seconds` the process (its whole cgroup) is killed after that long; its
        result then has `timed_out`.
        """
        call = _commands.start_process_call(self._sandbox_id, cmd, env=env, cwd=cwd,
                                            timeout_seconds=timeout_seconds)
        return AsyncProcess(self._sandbox_id, await self._http.run(call), self._http,
                            on_stdout, on_stderr)

    async def connect(self, pid: int, on_stdout: AsyncOutputCallback | None = None,
                      on_stderr: AsyncOutputCallback | None = None) -> AsyncProcess:
        """A handle on background process `pid`, e.g. one another client started: its
        `stream()` replays what the sandbox still holds of its output, then follows it live.
        `NotFoundError` if the sandbox knows no such process (running, or among the last 64
        that ended)."""
        info = _streams.find_process(await self.list(), pid)
        return AsyncProcess(self._sandbox_id, info, self._http, on_stdout, on_stderr)

    async def list(self) -> builtins.list[ProcessInfo]:
        """The processes started with `start()` that the sandbox still knows about."""
        return await self._http.run(_commands.list_processes_call(self._sandbox_id))


class AsyncProcess(_base.ProcessBase[AsyncHTTP]):
    """A background process started by `await sbx.commands.start()` (or found by
    `connect()`)."""

    async def stream(self, timeout_seconds: float | None = None
                     ) -> AsyncIterator[ProcessEvent]:
        """The process's output as `ProcessEvent`s: a `dropped` event if the sandbox's buffer
        already lost the start of it, the buffered output (all of stdout, then all of
        stderr), then live chunks as the process writes them, then one `exit` event (its
        `result`). Each chunk also goes to the `on_stdout`/`on_stderr` callbacks. Leaving the
        loop early detaches; the process keeps running. With `timeout_seconds`, stop with
        `WaitTimeoutError` after about that long (the process keeps running)."""
        decoder = _streams.ProcessStreamDecoder()
        call = _streams.stream_call(self._sandbox_id, self.pid, base_timeout=self._http.timeout,
                                    timeout_seconds=timeout_seconds)
        deadline = _deadline(timeout_seconds)
        with _waited(self.pid, timeout_seconds):
            async with self._http.stream(call) as response:
                async for chunk in response.aiter_bytes():
                    for event in decoder.feed(chunk):
                        await self._hand_out(event)
                        yield event
                    if decoder.done:
                        return
                    _check(deadline, self.pid, timeout_seconds)
                for event in decoder.close():
                    await self._hand_out(event)
                    yield event
        decoder.result()  # ProtocolError: the stream ended before the exit

    async def wait(self, timeout_seconds: float | None = None) -> ExecResult:
        """Wait for the process to exit and return its result (its whole output, as far as
        the sandbox's buffer still holds it).

        With `timeout_seconds`, give up waiting after that long (`WaitTimeoutError`). With
        `on_stdout`/`on_stderr` callbacks the output is streamed to them meanwhile.
        """
        if any(self._on_output.values()):
            result: ExecResult | None = None
            async for event in self.stream(timeout_seconds):
                result = event.result if event.type == "exit" else result
            assert result is not None
            return result
        return await self._http.run(_commands.wait_call(self._sandbox_id, self.pid,
                                                    timeout_seconds=timeout_seconds,
                                                    base_timeout=self._http.timeout))

    async def _hand_out(self, event: ProcessEvent) -> None:
        callback = self._on_output.get(event.type)
        if callback is not None:
            outcome = callback(event.data)
            if inspect.isawaitable(outcome):
                await outcome

    async def send_signal(self, sig: int) -> None:
        """Send signal `sig` (a number or a `signal.Signals`) to the process."""
        await self._http.run(_commands.signal_call(self._sandbox_id, self.pid, sig))

    async def kill(self) -> None:
        """Kill the process (SIGKILL)."""
        await self.send_signal(_signal.SIGKILL)

    async def send_stdin(self, data: str | bytes, eof: bool = False) -> None:
        """Write `data` (str is sent as UTF-8) to the process's stdin; `eof=True` closes it."""
        await self._http.run(_commands.send_stdin_call(self._sandbox_id, self.pid, data, eof=eof))


def _deadline(timeout_seconds: float | None) -> float | None:
    return None if timeout_seconds is None else time.monotonic() + timeout_seconds


def _check(deadline: float | None, pid: int, timeout_seconds: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise _timed_out(pid, timeout_seconds)


def _timed_out(pid: int, timeout_seconds: float | None) -> WaitTimeoutError:
    return WaitTimeoutError(f"process {pid} still running after {timeout_seconds:g} s",
                            status=408, code="timeout")


@contextlib.contextmanager
def _waited(pid: int, timeout_seconds: float | None) -> Iterator[None]:
    """A read that outlasts the wait asked for is the wait's end, not the network's."""
    try:
        yield
    except TransportTimeoutError as exc:
        if timeout_seconds is None:
            raise
        raise _timed_out(pid, timeout_seconds) from exc


def _deliver(chunks: Sequence[tuple[_base.StreamName, str]], on_stdout: OutputCallback | None,
             on_stderr: OutputCallback | None) -> None:
    for name, text in chunks:
        callback = on_stdout if name == "stdout" else on_stderr
        if callback is not None:
            callback(text)


async def _adeliver(chunks: Sequence[tuple[_base.StreamName, str]],
                    on_stdout: AsyncOutputCallback | None,
                    on_stderr: AsyncOutputCallback | None) -> None:
    for name, text in chunks:
        callback = on_stdout if name == "stdout" else on_stderr
        if callback is not None:
            outcome = callback(text)
            if inspect.isawaitable(outcome):
                await outcome
