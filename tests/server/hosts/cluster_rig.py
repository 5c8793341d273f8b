"""A cluster on this machine for tests: real `pandastack agent` processes registered in a
database of the session's PostgreSQL (heartbeat 0.5 s, stale after 3 s, or 60 s where no
host is to be lost), sharing one token and, when given, one object store; and API servers
over them that keep no state of their own (`create_app` with `cluster=True`, each with its
own store connection and host pool), the way `pandastack serve --db DSN --no-local-agent`
runs them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

from pandastack.registry import Registry
from tests.registry.conftest import member_agent, registry_of
from tests.server.conftest import Api, make_settings, running_app
from tests.server.live_agent import LiveAgent

HEARTBEAT_S = 0.5
STALE_S = 3.0
#: The stale window of a rig whose test loses no host: a heartbeat late on a loaded machine
#: (a second test worker's VMs) cannot fence a host mid-test, so such tests run in the
#: parallel lane (issue 33); those that lose a host or cut the database keep STALE_S.
CALM_STALE_S = 60.0


async def until(what: str, check: Callable[[], Awaitable[bool]], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


def write_token(path: Path, token: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")


@contextlib.asynccontextmanager
async def agents(dsn: str, count: int, *, object_store: str | None = None,
                 stale_s: float = STALE_S, flags: Sequence[str] = ()
                 ) -> AsyncIterator[list[LiveAgent]]:
    """`count` started agents (a shared token; `flags` last on their command lines); each
    is stopped and checked for leftovers on the way out (tests/registry/conftest
    .member_agent)."""
    common = ["--heartbeat-s", str(HEARTBEAT_S), "--stale-after-s", str(stale_s)]
    if object_store is not None:
        common += ["--object-store", object_store]
    common += flags
    token = secrets.token_urlsafe(32)
    async with contextlib.AsyncExitStack() as stack:
        started = [await stack.enter_async_context(member_agent(dsn, *common))
                   for _ in range(count)]
        for agent in started:
            write_token(agent.token_file, token)
            agent.start()
        yield started


@contextlib.asynccontextmanager
async def api_servers(tmp: Path, dsn: str, token_file: Path, count: int = 2,
                      stale_s: float = STALE_S, **overrides: object
                      ) -> AsyncIterator[list[Api]]:
    """`count` API servers on the database `dsn` (`stale_s`: the agents' stale window);
    the first makes the admin key, which every one of them is driven with."""
    async with contextlib.AsyncExitStack() as stack:
        servers: list[Api] = []
        admin_key: str | None = None
        for i in range(count):
            settings = make_settings(tmp / f"api{i}", db_url=dsn, cluster=True,
                                     agent_token_file=token_file,
                                     host_stale_seconds=stale_s, **overrides)
            api = await stack.enter_async_context(running_app(settings, None, admin_key))
            if admin_key is None:
                admin_key = json.loads(settings.client_config_path.read_text())["api_key"]
            servers.append(api)
        yield servers


def host_ids(registry: Registry, agents: Sequence[LiveAgent]) -> list[str]:
    """The registry's host id of each agent, in the agents' order."""
    by_endpoint = {h.endpoint: h.id for h in registry.list_hosts()}
    return [by_endpoint[f"unix:{agent.socket.resolve()}"] for agent in agents]


__all__ = ["CALM_STALE_S", "agents", "api_servers", "host_ids", "registry_of"]
