"""Name lookups of webhook targets, kept away from the threads the API needs.

`getaddrinfo` blocks its thread for as long as the name's servers take, and cannot be
cancelled. Run in the loop's default executor (what `loop.getaddrinfo` does), a few names
whose servers never answer take every thread that `asyncio.to_thread` hands the API's
store queries to: another team's `GET /v1/webhooks` waited 15.5 s behind twelve of them
(issue 33). So each lookup gets a daemon thread of its own, at most `threads` at once per
process, and its caller a deadline (`TeamLookups`) and a bound per team; a lookup past its
deadline is abandoned, its thread left to end when the system resolver gives up, and counted
against its team until then."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Awaitable, Callable

Resolver = Callable[[str, int], Awaitable[list[str]]]

#: Threads one process may have blocked in lookups at once (idle ones cost nothing).
LOOKUP_THREADS = 64
#: What one team's webhooks may have unanswered at once (abandoned ones included).
LOOKUPS_PER_TEAM = 4
#: How long a webhook's name may take to resolve (within the attempt's own deadline).
LOOKUP_SECONDS = 5.0


class LookupRefused(OSError):
    """A lookup this module gave up on or would not start; its message may be shown."""


class ThreadResolver:
    """`getaddrinfo` in a daemon thread per lookup (never the default executor). Past
    `threads` unanswered lookups it refuses at once (OSError) rather than queue."""

    def __init__(self, threads: int = LOOKUP_THREADS) -> None:
        self._slots = threading.BoundedSemaphore(threads)

    async def __call__(self, host: str, port: int) -> list[str]:
        if not self._slots.acquire(blocking=False):
            raise LookupRefused("too many name lookups unanswered on this server")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[list[str]] = loop.create_future()

        def settle(result: list[str] | None, error: BaseException | None) -> None:
            if done.done():  # abandoned at its deadline
                return
            if error is not None:
                done.set_exception(error)
            else:
                done.set_result(result or [])

        def lookup() -> None:
            result: list[str] | None = None
            error: BaseException | None = None
            try:
                # Looked up at call time so a test can stand in for the system resolver.
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                result = [str(info[4][0]) for info in infos]
            except Exception as exc:
                error = exc
            finally:
                self._slots.release()
            with contextlib.suppress(RuntimeError):  # the loop closed while we waited
                loop.call_soon_threadsafe(settle, result, error)

        threading.Thread(target=lookup, name="pandastack-webhook-dns", daemon=True).start()
        return await done


class TeamLookups:
    """A resolver with a deadline and a bound per team on what is unanswered. The bound
    counts a lookup until its resolver returns, not until its caller gave up on it: a team
    whose names never answer holds at most `per_team` of the resolver's threads."""

    def __init__(self, resolve: Resolver, *, seconds: float = LOOKUP_SECONDS,
                 per_team: int = LOOKUPS_PER_TEAM) -> None:
        self.resolve = resolve
        self.seconds = seconds
        self.per_team = per_team
        self._open: dict[str, set[asyncio.Task[list[str]]]] = {}

    def unanswered(self, team: str) -> int:
        return len(self._open.get(team, ()))

    async def __call__(self, team: str, host: str, port: int) -> list[str]:
        mine = self._open.setdefault(team, set())
        if len(mine) >= self.per_team:
            raise LookupRefused("too many of this team's name lookups are unanswered")
        task = asyncio.ensure_future(self.resolve(host, port))
        mine.add(task)

        def forget(t: asyncio.Task[list[str]]) -> None:
            mine.discard(t)
            if not mine and self._open.get(team) is mine:
                del self._open[team]
            if not t.cancelled():
                t.exception()  # retrieved: an abandoned lookup's error is not news

        task.add_done_callback(forget)
        try:
            async with asyncio.timeout(self.seconds):
                return await asyncio.shield(task)
        except TimeoutError:
            raise LookupRefused(f"no answer within {self.seconds:g} s") from None

    def close(self) -> None:
        """Stop waiting for what is unanswered (the threads end on their own)."""
        for tasks in list(self._open.values()):
            for task in list(tasks):
                task.cancel()
