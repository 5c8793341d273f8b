"""Sandboxes by name through the SDK against the live server (real VMs): get_or_create
returns the same sandbox with its files, connect takes the name, concurrent async calls get
one sandbox, and a kill frees the name."""

from __future__ import annotations

import asyncio

import pytest

from pandastack import AsyncSandbox, Sandbox
from tests.e2e.conftest import LiveServer

pytestmark = [pytest.mark.vm, pytest.mark.e2e]


def test_get_or_create_by_name(live_server: LiveServer) -> None:
    creds = {"api_url": live_server.api_url, "api_key": live_server.api_key}
    first = Sandbox.get_or_create("e2e-names", ttl_seconds=300, **creds)  # type: ignore[arg-type]
    try:
        assert first.info.name == "e2e-names"
        first.files.write("/work/kept", "by name\n")
        again = Sandbox.get_or_create("e2e-names", **creds)  # type: ignore[arg-type]
        assert again.id == first.id
        assert again.files.read("/work/kept", format="text") == "by name\n"
        again.close()
        by_name = Sandbox.connect("e2e-names", **creds)  # type: ignore[arg-type]
        assert by_name.id == first.id
        by_name.close()

        async def three() -> set[str]:
            handles = await asyncio.gather(*(AsyncSandbox.get_or_create(
                "e2e-names", **creds) for _ in range(3)))  # type: ignore[arg-type]
            ids = {h.id for h in handles}
            for h in handles:
                await h.close()
            return ids
        assert asyncio.run(three()) == {first.id}
    finally:
        first.kill()
    second = Sandbox.get_or_create("e2e-names", ttl_seconds=300, **creds)  # type: ignore[arg-type]
    try:
        assert second.id != first.id  # the name was freed by the kill
        assert not second.files.exists("/work/kept")
    finally:
        second.kill()
