"""`sbx.code`: run code in the sandbox's kernel (state persists between runs), in the default
context of a language or in contexts of your own. `sbx.run_code(...)` is `sbx.code.run(...)`.

`CodeInterpreter` is the sync twin, `AsyncCodeInterpreter` the async one; both send calls built in
`_code`, so they differ only in `await`.
"""

from __future__ import annotations

import builtins
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping

from pandastack.sdk import _base, _code
from pandastack.sdk._code import CodeEvent, Execution, Language, Result
from pandastack.sdk._http import HTTP, AsyncHTTP
from pandastack.wire import sandboxes as wire

__all__ = ["AsyncCodeInterpreter", "CodeEvent", "CodeInterpreter", "Execution", "Result"]

#: Called with each event of a run as it arrives (stdout/stderr text, results, the error).
EventCallback = Callable[[CodeEvent], object]
AsyncEventCallback = Callable[[CodeEvent], Awaitable[object] | object]

DEFAULT_CODE_TIMEOUT = 300.0


class CodeInterpreter(_base.NamespaceBase[HTTP]):
    """The code interpreter of one sandbox (`sbx.code`)."""

    def run(self, code: str, language: Language = "python",
            context: str | wire.CodeContext | None = None,
            timeout_seconds: float = DEFAULT_CODE_TIMEOUT,
            env: Mapping[str, str] | None = None,
            on_event: EventCallback | None = None) -> Execution:
        """Run `code` and return its `Execution` (stdout, stderr, rich `results`, `error`).

        An exception raised by the code comes back as `execution.error` (name, value,
        traceback), not as an SDK exception. After `timeout_seconds` the kernel is
        interrupted (error name "TimeoutError"); its state is kept. With `on_event`, every
        event is handed over as it arrives.
        """
        if on_event is None:
            return self._http.run(_code.run_code_call(
                self._sandbox_id, code, language=language, context=context,
                timeout_seconds=timeout_seconds, env=env, stream=False,
                base_timeout=self._http.timeout))
        decoder = _code.CodeStreamDecoder()
        for event in self._events(decoder, code, language, context, timeout_seconds, env):
            on_event(event)
        return decoder.result()

    def stream(self, code: str, language: Language = "python",
               context: str | wire.CodeContext | None = None,
               timeout_seconds: float = DEFAULT_CODE_TIMEOUT,
               env: Mapping[str, str] | None = None) -> Iterator[CodeEvent]:
        """Run `code`, yielding its events as they arrive; the last is always type "end"."""
        yield from self._events(_code.CodeStreamDecoder(), code, language, context,
                                timeout_seconds, env)

    def _events(self, decoder: _code.CodeStreamDecoder, code: str, language: Language,
                context: str | wire.CodeContext | None, timeout_seconds: float,
                env: Mapping[str, str] | None) -> Iterator[CodeEvent]:
        call = _code.run_code_call(self._sandbox_id, code, language=language, context=context,
                                   timeout_seconds=timeout_seconds, env=env, stream=True,
                                   base_timeout=self._http.timeout)
        with self._http.stream(call) as response:
            for chunk in response.iter_bytes():
                yield from decoder.feed(chunk)
                if decoder.done:
                    return
            yield from decoder.close()
        decoder.result()  # ProtocolError if the stream ended without its end event

    def create_context(self, language: Language = "python",
                       cwd: str | None = None) -> wire.CodeContext:
        """A new context: its own kernel, so its state is independent of the others."""
        return self._http.run(_code.create_context_call(self._sandbox_id, language, cwd))

    def list_contexts(self) -> builtins.list[wire.CodeContext]:
        """The sandbox's code contexts (the default ones included once used)."""
        return self._http.run(_code.list_contexts_call(self._sandbox_id))

    def restart_context(self, context: str | wire.CodeContext) -> None:
        """Restart the context's kernel: its state is lost, the context stays."""
        self._http.run(_code.restart_context_call(self._sandbox_id, context))

    def remove_context(self, context: str | wire.CodeContext) -> None:
        """Delete the context and stop its kernel."""
        self._http.run(_code.remove_context_call(self._sandbox_id, context))


class AsyncCodeInterpreter(_base.NamespaceBase[AsyncHTTP]):
    """The code interpreter of one sandbox (`sbx.code`), async."""

    async def run(self, code: str, language: Language = "python",
                  context: str | wire.CodeContext | None = None,
                  timeout_seconds: float = DEFAULT_CODE_TIMEOUT,
                  env: Mapping[str, str] | None = None,
                  on_event: AsyncEventCallback | None = None) -> Execution:
        """Run `code` and return its `Execution` (stdout, stderr, rich `results`, `error`).

        An exception raised by the code comes back as `execution.error` (name, value,
        traceback), not as an SDK exception. After `timeout_seconds` the kernel is
        interrupted (error name "TimeoutError"); its state is kept. With `on_event` (a plain
        or async function), every event is handed over as it arrives.
        """
        if on_event is None:
            return await self._http.run(_code.run_code_call(
                self._sandbox_id, code, language=language, context=context,
                timeout_seconds=timeout_seconds, env=env, stream=False,
                base_timeout=self._http.timeout))
        decoder = _code.CodeStreamDecoder()
        async for event in self._events(decoder, code, language, context, timeout_seconds,
                                        env):
            outcome = on_event(event)
            if inspect.isawaitable(outcome):
                await outcome
        return decoder.result()

    async def stream(self, code: str, language: Language = "python",
                     context: str | wire.CodeContext | None = None,
                     timeout_seconds: float = DEFAULT_CODE_TIMEOUT,
                     env: Mapping[str, str] | None = None) -> AsyncIterator[CodeEvent]:
        """Run `code`, yielding its events as they arrive; the last is always type "end"."""
        async for event in self._events(_code.CodeStreamDecoder(), code, language, context,
                                        timeout_seconds, env):
            yield event

    async def _events(self, decoder: _code.CodeStreamDecoder, code: str, language: Language,
                      context: str | wire.CodeContext | None, timeout_seconds: float,
                      env: Mapping[str, str] | None) -> AsyncIterator[CodeEvent]:
        call = _code.run_code_call(self._sandbox_id, code, language=language, context=context,
                                   timeout_seconds=timeout_seconds, env=env, stream=True,
                                   base_timeout=self._http.timeout)
        async with self._http.stream(call) as response:
            async for chunk in response.aiter_bytes():
                for event in decoder.feed(chunk):
                    yield event
                if decoder.done:
                    return
            for event in decoder.close():
                yield event
        decoder.result()

    async def create_context(self, language: Language = "python",
                             cwd: str | None = None) -> wire.CodeContext:
        """A new context: its own kernel, so its state is independent of the others."""
        return await self._http.run(_code.create_context_call(self._sandbox_id, language, cwd))

    async def list_contexts(self) -> builtins.list[wire.CodeContext]:
        """The sandbox's code contexts (the default ones included once used)."""
        return await self._http.run(_code.list_contexts_call(self._sandbox_id))

    async def restart_context(self, context: str | wire.CodeContext) -> None:
        """Restart the context's kernel: its state is lost, the context stays."""
        await self._http.run(_code.restart_context_call(self._sandbox_id, context))

    async def remove_context(self, context: str | wire.CodeContext) -> None:
        """Delete the context and stop its kernel."""
        await self._http.run(_code.remove_context_call(self._sandbox_id, context))
