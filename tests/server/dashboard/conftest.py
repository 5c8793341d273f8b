"""The browser tests' server and browser: a real uvicorn over the in-memory host
(tests/server/live.fake_server) for the module, which must end with no live sandbox, and a
Chromium signed in to its dashboard, which must have logged no error."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pandastack import Client
from tests.server.live import FakeServer, fake_server

if TYPE_CHECKING:
    from tests.server.browser import Browser


@pytest.fixture(scope="module")
def server_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The server's directory (its database, `pandastack.db`, for what a test puts there)."""
    return tmp_path_factory.mktemp("dashboard")


@pytest.fixture(scope="module")
def server(server_dir: Path) -> Iterator[FakeServer]:
    with fake_server(server_dir) as srv:
        yield srv
        with Client(srv.url, srv.admin_key) as client:
            left = [s.id for s in client.sandboxes.list()]  # the live ones
        assert not left, f"sandboxes left: {left}"


@pytest.fixture(scope="module")
def signed_in(server: FakeServer) -> Iterator[Browser]:
    # Imported here: Playwright is only for these browser tests, not test_dashboard_http.
    from tests.server.browser import signed_in_chromium

    with signed_in_chromium(server.url, server.admin_key) as browser:
        yield browser
