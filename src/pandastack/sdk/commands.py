"""`sbx.commands`: run commands to completion, or start processes and drive them.

`Commands`/`Process` are the sync twins, `AsyncCommands`/`AsyncProcess` the async ones; both send
calls built in `_base`, so they differ only in `await`.
"""

from __future__ import annotations

import builtins
import inspect
import signal as _signal
from collections.abc import Mapping, Sequence

from pandastack.sdk import _base, _commands
from pandastack.sdk._http import HTTP, AsyncHTTP
from pandastack.sdk.models import AsyncOutputCallback, ExecResult, OutputCallback, ProcessInfo

__all__ = ["AsyncCommands", "AsyncProcess", "Commands", "Process"]


class Commands(_base.NamespaceBase[HTTP]):
    """Commands of one sandbox (`sbx.commands`)."""

    def run(self, cmd: str | Sequence[str], timeout_seconds: float = 60,
            env: Mapping[str, str] | None = None, cwd: str | None = None,
            stdin: str | None = None, on_stdout: OutputCallback | None = None,
            on_stderr: OutputCallback | None = None) -> ExecResult:
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
                               base_timeout=self._http.timeout)
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
              cwd: str | None = None) -> Process:
        """Start `cmd` in the background and return a `Process` handle to drive it."""
        info = self._http.run(_commands.start_process_call(self._sandbox_id, cmd, env=env, cwd=cwd))
        return Process(self._sandbox_id, info, self._http)

    def list(self) -> builtins.list[ProcessInfo]:
        """The processes started with `start()` that the sandbox still knows about."""
        return self._http.run(_commands.list_processes_call(self._sandbox_id))


class Process(_base.ProcessBase[HTTP]):
    """A background process started by `sbx.commands.start()`."""

    def wait(self, timeout_seconds: float | None = None) -> ExecResult:
        """Wait for the process to exit and return its result (its whole output).

        With `timeout_seconds`, the server gives up waiting after that long.
        """
        return self._http.run(_commands.wait_call(self._sandbox_id, self.pid,
                                              timeout_seconds=timeout_seconds,
                                              base_timeout=self._http.timeout))

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
                  on_stderr: AsyncOutputCallback | None = None) -> ExecResult:
        """Run `cmd` to completion and return its `ExecResult`.

        `cmd` is a shell command line (a string) or an argv list. The command is killed after
        `timeout_seconds` (then `timed_out` is true); the HTTP read timeout is set above that, so
        long commands are never cut by the client. With `on_stdout`/`on_stderr` (plain or async
        functions) the output is streamed: each callback gets every chunk of text as it
        arrives, and the result still holds the whole output.
        """
        streaming = on_stdout is not None or on_stderr is not None
        call = _commands.exec_call(self._sandbox_id, cmd, timeout_seconds=timeout_seconds, env=env,
                               cwd=cwd, stdin=stdin, stream=streaming,
                               base_timeout=self._http.timeout)
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
                    cwd: str | None = None) -> AsyncProcess:
        """Start `cmd` in the background and return an `AsyncProcess` handle to drive it."""
        call = _commands.start_process_call(self._sandbox_id, cmd, env=env, cwd=cwd)
        return AsyncProcess(self._sandbox_id, await self._http.run(call), self._http)

    async def list(self) -> builtins.list[ProcessInfo]:
        """The processes started with `start()` that the sandbox still knows about."""
        return await self._http.run(_commands.list_processes_call(self._sandbox_id))


class AsyncProcess(_base.ProcessBase[AsyncHTTP]):
    """A background process started by `await sbx.commands.start()`."""

    async def wait(self, timeout_seconds: float | None = None) -> ExecResult:
        """Wait for the process to exit and return its result (its whole output).

        With `timeout_seconds`, the server gives up waiting after that long.
        """
        return await self._http.run(_commands.wait_call(self._sandbox_id, self.pid,
                                                    timeout_seconds=timeout_seconds,
                                                    base_timeout=self._http.timeout))

    async def send_signal(self, sig: int) -> None:
        """Send signal `sig` (a number or a `signal.Signals`) to the process."""
        await self._http.run(_commands.signal_call(self._sandbox_id, self.pid, sig))

    async def kill(self) -> None:
        """Kill the process (SIGKILL)."""
        await self.send_signal(_signal.SIGKILL)

    async def send_stdin(self, data: str | bytes, eof: bool = False) -> None:
        """Write `data` (str is sent as UTF-8) to the process's stdin; `eof=True` closes it."""
        await self._http.run(_commands.send_stdin_call(self._sandbox_id, self.pid, data, eof=eof))


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
