"""Which API servers and agents work together while versions differ (a rolling upgrade).

The host API has a *protocol level*: an integer raised by a change one side cannot follow
without the other (a route, a field or an error that changes meaning). Each side speaks its
own level and still works with the level before it: `oldest` is the lowest level of the
other side it serves. An API server and an agent work together when each one's level is
at least the other's `oldest`: with one level's step, agents first or API servers first,
every pair in a rolling upgrade qualifies; two levels apart, none does.

Agents report their levels to the registry when they register (`hosts.protocol`,
`hosts.oldest_protocol`); an API server places nothing on a host it cannot work with, shows
it `incompatible` with the reason, and logs it. Agents from before levels were exchanged
registered none: the registry's defaults read them as level 1, the host API as it was then.

The guest protocol (spec/guest-protocol.md) has its own version, checked at each handshake
(host/agentlink/handshake.py)."""

from __future__ import annotations

from dataclasses import dataclass

HOST_PROTOCOL = 2
"""The host API's level as this code speaks it (1: before levels were exchanged)."""
OLDEST_HOST_PROTOCOL = HOST_PROTOCOL - 1
"""The lowest level of the other side this code works with: one behind."""


@dataclass(frozen=True)
class Levels:
    """One side's host API level and the oldest level of the other side it serves."""

    level: int
    oldest: int

    @classmethod
    def speaking(cls, level: int) -> Levels:
        """A side at `level` that works with the level before it, as this code does."""
        return cls(level, level - 1)


OURS = Levels(HOST_PROTOCOL, OLDEST_HOST_PROTOCOL)


def refusal(server: Levels, agent: Levels) -> str | None:
    """Why an API server at `server` and an agent at `agent` cannot work together, saying
    which side to upgrade; None when they can."""
    if agent.level < server.oldest:
        return (f"agent speaks host protocol {agent.level}, older than this API server "
                f"serves ({server.oldest} to {server.level}): upgrade the agent")
    if server.level < agent.oldest:
        return (f"agent speaks host protocol {agent.level} and serves API servers of level "
                f"{agent.oldest} or newer; this API server is at {server.level}: upgrade "
                f"the API servers")
    return None
