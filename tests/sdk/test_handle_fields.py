"""A sandbox handle carries its info's fields as read-only properties (`sbx.state`,
`sbx.template`, `sbx.metadata`, `sbx.host_id`, ...): scripts written against the earlier list,
whose items had them, broke with AttributeError on the handles `Sandbox.list()` returns now.
The values are those listed, and `refresh()` updates them. Both twins and
`client.sandboxes.list()`, against a real uvicorn server over the in-memory runtime."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from pandastack.sdk import AsyncClient, AsyncSandbox, Client, Sandbox
from pandastack.wire.sandboxes import SandboxInfo
from tests.server.live import FakeServer, fake_server

# On the handle `snapshot` is the method that takes one; the field stays `info.snapshot`.
NOT_PROPERTIES = {"snapshot"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeServer]:
    with fake_server(tmp_path_factory.mktemp("sdk-fields")) as srv:
        yield srv


@pytest.mark.parametrize("cls", [Sandbox, AsyncSandbox], ids=lambda c: c.__name__)
def test_every_info_field_is_a_read_only_property(cls: type) -> None:
    for field in set(SandboxInfo.model_fields) - NOT_PROPERTIES:
        prop = getattr(cls, field, None)
        assert isinstance(prop, property), f"{cls.__name__}.{field}"
        assert prop.fset is None, f"{cls.__name__}.{field} is settable"


def state_now(sbx: Sandbox | AsyncSandbox) -> str:
    """`sbx.state` read afresh: mypy keeps an earlier `== "running"` narrowing of the
    attribute itself past `refresh()`."""
    return sbx.state


def same_as_info(sbx: Sandbox | AsyncSandbox) -> None:
    for field in set(SandboxInfo.model_fields) - NOT_PROPERTIES:
        assert getattr(sbx, field) == getattr(sbx.info, field), field


def test_sync_listed_handles_have_the_fields(server: FakeServer) -> None:
    label = {"suite": secrets.token_hex(4)}
    kw: dict[str, Any] = {"api_url": server.url, "api_key": server.admin_key}
    with Client(**kw) as client:
        made = client.sandboxes.create(ttl_seconds=300, metadata=label, name="fields-sync")
        (listed,) = Sandbox.list(metadata=label, **kw)
        try:
            assert (listed.id, listed.state, listed.template) == (made.id, "running", "base")
            assert (listed.metadata, listed.name, listed.ttl_seconds) == (
                label, "fields-sync", 300)
            assert listed.created_at == made.info.created_at
            assert listed.expires_at == made.info.expires_at is not None
            assert listed.ended_at is None and listed.persistent is False
            same_as_info(listed)
            with pytest.raises(AttributeError):
                listed.state = "paused"  # type: ignore[misc]
            listed.metadata["suite"] = "changed"  # a copy: the handle's info is untouched
            assert listed.info.metadata == label

            made.pause()
            assert listed.state == "running"  # as listed, until it asks again
            listed.refresh()
            assert state_now(listed) == "paused"
            same_as_info(listed)
            (via_client,) = client.sandboxes.list(metadata=label)
            assert via_client.state == "paused"
            made.kill()
            listed.refresh()
            assert state_now(listed) == "killed" and listed.ended_at is not None
            assert listed.end_reason is not None
        finally:
            made.kill()
            listed.close()


async def test_async_listed_handles_have_the_fields(server: FakeServer) -> None:
    label = {"suite": secrets.token_hex(4)}
    kw: dict[str, Any] = {"api_url": server.url, "api_key": server.admin_key}
    async with AsyncClient(**kw) as client:
        made = await client.sandboxes.create(ttl_seconds=120, metadata=label)
        (listed,) = await AsyncSandbox.list(metadata=label, **kw)
        try:
            assert (listed.id, listed.state, listed.ttl_seconds) == (made.id, "running", 120)
            assert listed.metadata == label and listed.host_id == made.info.host_id
            same_as_info(listed)
            await made.hibernate()
            assert listed.state == "running"
            await listed.refresh()
            assert state_now(listed) == "hibernated"
            (via_client,) = await client.sandboxes.list(metadata=label)
            assert via_client.state == "hibernated"
            same_as_info(via_client)
        finally:
            await made.kill()
            await listed.close()
