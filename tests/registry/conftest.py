"""Registry fixtures: a database of its own per test on the session's PostgreSQL (the
`postgres` fixture of tests/conftest.py), the `db` fixture of tests/server, and real
`pandastack agent` processes that register in it."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator, Iterator

import pytest

from pandastack.registry import Registry
from pandastack.server.store.db import make_engine, migrate
from tests.leftovers import owned_tmpdir
from tests.server.conftest import db
from tests.server.live_agent import LiveAgent, assert_nothing_left, stop_cleanly
from tests.services import Postgres

__all__ = ["db"]


@pytest.fixture
def pg_dsn(postgres: Postgres) -> Iterator[str]:
    """A new empty database on the session's PostgreSQL."""
    with postgres.database() as dsn:
        yield dsn


@contextlib.contextmanager
def registry_of(dsn: str) -> Iterator[Registry]:
    engine = make_engine(dsn)
    migrate(engine)
    registry = Registry(engine)
    try:
        yield registry
    finally:
        registry.close()


@contextlib.asynccontextmanager
async def member_agent(dsn: str, *flags: str) -> AsyncIterator[LiveAgent]:
    """An agent registered at `dsn` (started by the test: `agent.start()`); on the way out
    it gets SIGTERM if it runs, then whatever its dirs still hold is killed and the test
    fails on it."""
    tmp = owned_tmpdir("prg-")
    agent = LiveAgent(tmp)
    agent.extra_args = ["--db", dsn, *flags]
    try:
        yield agent
        stop_cleanly(agent)
    finally:
        try:
            await assert_nothing_left(agent)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
