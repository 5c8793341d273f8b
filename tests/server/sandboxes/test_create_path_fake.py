"""The store work of a create and of the calls right after it (issue 36, target 1), through
the HTTP layer over the in-memory runtime: after the host call a create writes its row once
(the `starting` -> `running` UPDATE checks the state and returns the row), answers without
reading attachments it did not make, and the first call on the new sandbox writes no activity
time (the create just wrote one). A kill that lands while the host is still creating wins:
the create answers 409 and its VM is killed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

import pytest
from sqlalchemy import event

from pandastack.hostport.network import NetworkPolicy
from pandastack.hostport.volumes import VolumeMountRequest
from pandastack.server.sandboxes import activity
from pandastack.server.store import Store
from tests.server.conftest import Api, make_settings, running_app
from tests.server.fakes import FakeRuntime, FakeSandbox

DEADLINE = 30.0


class HeldCreate(FakeRuntime):
    """The fake host, whose create waits until the test lets it finish."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.hold = False
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def create(self, template: str = "base", *, vcpus: int = 1, memory_mb: int = 512,
                     disk_mb: int | None = None, sandbox_id: str | None = None,
                     snapshot: str | None = None, network: NetworkPolicy | None = None,
                     volumes: Sequence[VolumeMountRequest] = (),
                     ) -> FakeSandbox:
        if self.hold:
            self.entered.set()
            await asyncio.wait_for(self.release.wait(), DEADLINE)
        return await super().create(template, vcpus=vcpus, memory_mb=memory_mb,
                                    disk_mb=disk_mb, sandbox_id=sandbox_id, snapshot=snapshot,
                                    network=network, volumes=volumes)


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async with running_app(make_settings(tmp_path), HeldCreate(tmp_path / "sandboxes")) as a:
        yield a


@contextmanager
def sandbox_statements(store: Store) -> Iterator[list[str]]:
    """The statements on one sandbox's row (background tasks read and write other tables,
    and the reaper reads every live row, meanwhile)."""
    seen: list[str] = []

    def note(_conn: object, _cursor: object, statement: str, *_rest: object) -> None:
        words = statement.split()
        if (words[0] == "SELECT" and "FROM sandboxes" in statement
                and "WHERE sandboxes.id = " in statement) or words[:3] in (
                    ["UPDATE", "sandboxes", "SET"], ["INSERT", "INTO", "sandboxes"]):
            seen.append(" ".join(words[:2]))

    event.listen(store.engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        event.remove(store.engine, "before_cursor_execute", note)


async def test_a_create_and_its_first_exec_ask_the_store_little(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    # On a loaded machine the exec may come later than the coalescing window after the
    # create; what is checked is that the create's own write counts as the activity.
    monkeypatch.setattr(activity, "TOUCH_COALESCE_SECONDS", 3600.0)
    store: Store = api.app.state.store
    with sandbox_statements(store) as seen:
        r = await api.client.post("/v1/sandboxes", json={"template": "base"})
    assert r.status_code == 201, r.text
    assert r.json()["state"] == "running" and r.json()["volumes"] == []
    # the row's INSERT at admission; after the host call one UPDATE that checks it is still
    # starting and returns it (no read before it)
    assert seen == ["INSERT INTO", "UPDATE sandboxes"], seen
    sid = r.json()["id"]
    with sandbox_statements(store) as seen:
        r = await api.client.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"})
    assert r.status_code == 200, r.text
    assert seen == ["SELECT sandboxes.id,"], seen  # its row; no activity write


async def test_a_create_takes_the_team_lock_without_looking_for_the_team_again(
        api: Api) -> None:
    store: Store = api.app.state.store
    first = await api.client.post("/v1/sandboxes", json={"template": "base"})
    assert first.status_code == 201, first.text
    seen: list[str] = []
    # Only the request's own statements: the webhook delivery loop and the reaper query the
    # store meanwhile (ci3 saw the delivery loop's SELECT first). Its store calls run in
    # threads that copy the request's context; the background tasks began without this.
    in_request: ContextVar[bool] = ContextVar("in_request", default=False)

    def note(_conn: object, _cursor: object, statement: str, *_rest: object) -> None:
        if in_request.get():
            seen.append(" ".join(statement.split()[:4]))

    event.listen(store.engine, "before_cursor_execute", note)
    token = in_request.set(True)
    try:
        r = await api.client.post("/v1/sandboxes", json={"template": "base"})
    finally:
        in_request.reset(token)
        event.remove(store.engine, "before_cursor_execute", note)
    assert r.status_code == 201, r.text
    # BEGIN IMMEDIATE is SQLite's whole team lock once the team's row is known to exist
    assert not [s for s in seen if "teams" in s], seen
    assert seen[0] == "BEGIN IMMEDIATE", seen
    row = store.sandbox_by_id(r.json()["id"])
    assert row is not None and row.state == "running"
    # the Core INSERT wrote the columns' defaults, as the ORM's flush did
    assert (row.persistent, row.env, row.meta, row.quota_hold) == (False, {}, {}, None)


async def test_a_kill_while_the_host_creates_wins(api: Api) -> None:
    runtime = api.app.state.service.runtime
    assert isinstance(runtime, HeldCreate)
    runtime.hold = True
    create = asyncio.create_task(api.client.post("/v1/sandboxes", json={"template": "base"}))
    await asyncio.wait_for(runtime.entered.wait(), DEADLINE)
    listed = await api.client.get("/v1/sandboxes", params={"state": "starting"})
    [sid] = [s["id"] for s in listed.json()["sandboxes"]]
    r = await api.client.delete(f"/v1/sandboxes/{sid}")
    assert r.status_code == 204, r.text
    runtime.release.set()
    answer = await asyncio.wait_for(create, DEADLINE)
    assert answer.status_code == 409, answer.text
    assert "ended while it was starting" in answer.json()["error"]["message"]
    assert sid not in runtime.sandboxes  # its VM was killed
    r = await api.client.get(f"/v1/sandboxes/{sid}")
    assert r.json()["state"] == "killed", r.text
