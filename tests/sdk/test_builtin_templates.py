"""`client.templates.builtin()`, both twins: the built-in templates the server lists beside
the team's own (a fresh install's `templates.list()` is empty, yet base, python, node,
code-interpreter and full exist), the default marked. Against a real uvicorn server over the
in-memory runtime."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pandastack.rules import BUILTIN_TEMPLATE_NAMES, DEFAULT_TEMPLATE
from pandastack.sdk import AsyncClient, Client
from tests.server.live import FakeServer, fake_server

WANT = [("base", True), ("code-interpreter", False), ("full", False), ("node", False),
        ("python", False)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeServer]:
    with fake_server(tmp_path_factory.mktemp("sdk-builtin")) as srv:
        yield srv


def test_the_pairs_are_the_rules() -> None:
    assert {n for n, _ in WANT} == BUILTIN_TEMPLATE_NAMES
    assert [n for n, default in WANT if default] == [DEFAULT_TEMPLATE]


def test_sync(server: FakeServer) -> None:
    with Client(server.url, server.admin_key) as client:
        assert client.templates.list() == []
        assert [(b.name, b.default) for b in client.templates.builtin()] == WANT
        key = client.keys.create("plain", team="team-builtin").key
    with Client(server.url, key) as team:
        assert [(b.name, b.default) for b in team.templates.builtin()] == WANT


async def test_async(server: FakeServer) -> None:
    async with AsyncClient(server.url, server.admin_key) as client:
        assert [(b.name, b.default) for b in await client.templates.builtin()] == WANT
