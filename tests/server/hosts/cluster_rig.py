"""A cluster on this machine for tests: real `pandastack agent` processes registered in a
database of the session's PostgreSQL (heartbeat 0.5 s, stale after 3 s), sharing one token
and, when given, one object store; and API servers over them that keep no state of their
own (`create_app` with `cluster=True`, each with its own store connection and host pool),
the way `pandastack serve --db DSN --no-local-agent` runs them."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from pandastack.registry import Registry
from tests.registry.conftest import member_agent, registry_of
from tests.server.conftest import Api, make_settings, running_app
from tests.server.live_agent import LiveAgent

HEARTBEAT_S = 0.5
STALE_S = 3.0


def write_token(path: Path, token: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")


@contextlib.asynccontextmanager
async def agents(dsn: str, count: int, *, object_store: str | None = None
                 ) -> AsyncIterator[list[LiveAgent]]:
    """`count` started agents (a shared token); each is stopped and checked for leftovers
    on the way out (tests/registry/conftest.member_agent)."""
    flags = ["--heartbeat-s", str(HEARTBEAT_S), "--stale-after-s", str(STALE_S)]
    if object_store is not None:
        flags += ["--object-store", object_store]
    token = secrets.token_urlsafe(32)
    async with contextlib.AsyncExitStack() as stack:
        started = [await stack.enter_async_context(member_agent(dsn, *flags))
                   for _ in range(count)]
        for agent in started:
            write_token(agent.token_file, token)
            agent.start()
        yield started


@contextlib.asynccontextmanager
async def api_servers(tmp: Path, dsn: str, token_file: Path, count: int = 2,
                      **overrides: object) -> AsyncIterator[list[Api]]:
    """`count` API servers on the database `dsn`; the first makes the admin key, which
    every one of them is driven with."""
    async with contextlib.AsyncExitStack() as stack:
        servers: list[Api] = []
        admin_key: str | None = None
        for i in range(count):
            settings = make_settings(tmp / f"api{i}", db_url=dsn, cluster=True,
                                     agent_token_file=token_file,
                                     host_stale_seconds=STALE_S, **overrides)
            api = await stack.enter_async_context(running_app(settings, None, admin_key))
            if admin_key is None:
                admin_key = json.loads(settings.client_config_path.read_text())["api_key"]
            servers.append(api)
        yield servers


def host_ids(registry: Registry, agents: Sequence[LiveAgent]) -> list[str]:
    """The registry's host id of each agent, in the agents' order."""
    by_endpoint = {h.endpoint: h.id for h in registry.list_hosts()}
    return [by_endpoint[f"unix:{agent.socket.resolve()}"] for agent in agents]


__all__ = ["agents", "api_servers", "host_ids", "registry_of"]
