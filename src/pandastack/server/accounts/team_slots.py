"""Bounds on what one team holds open at once on this server (issue 22, "bounded
everything"): commands running, and streams and terminals attached. Each is a count per team
taken for the life of the request or connection; past the limit the caller gets 429
`rate_limited` at once, never a queue, so one team's flood cannot hold the server's tasks,
sockets and host connections that other teams need. Counts are per API server: behind N
servers a team may hold N times as much, each server still bounded."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..web.errors import ApiError


class TeamSlots:
    def __init__(self, limit: int, what: str) -> None:
        """`what`: the plural noun the refusal names ("commands running")."""
        if limit < 1:
            raise ValueError(f"the limit of {what} per team must be >= 1")
        self.limit = limit
        self.what = what
        self._held: dict[str, int] = {}

    def held(self, team: str) -> int:
        return self._held.get(team, 0)

    def acquire(self, team: str) -> Callable[[], None]:
        """Take one of `team`'s slots (429 when it holds them all); returns its release,
        which may be called more than once (a stream ends by several paths)."""
        if self._held.get(team, 0) >= self.limit:
            raise ApiError(429, "rate_limited",
                           f"team {team!r} has {self.limit} {self.what} on this server "
                           "already: end one first", headers={"Retry-After": "1"})
        self._held[team] = self._held.get(team, 0) + 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            left = self._held[team] - 1
            if left:
                self._held[team] = left
            else:
                del self._held[team]
        return release

    @contextmanager
    def take(self, team: str) -> Iterator[None]:
        release = self.acquire(team)
        try:
            yield
        finally:
            release()
