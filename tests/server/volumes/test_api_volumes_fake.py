"""Volumes over the HTTP layer with the in-memory host (on SQLite and PostgreSQL): CRUD, the
one-writer rule on create, attachments in SandboxInfo, fork and snapshot copies, and the
404/409/422 cases (never a 500). What a volume holds is tested with real VMs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pandastack.rules import clone_volume_id
from tests.server.conftest import Api, assert_envelope, make_settings, running_app
from tests.server.fakes import FakeRuntime


@pytest.fixture
def runtime(tmp_path: Path) -> FakeRuntime:
    return FakeRuntime(tmp_path)


@pytest.fixture
async def api(tmp_path: Path, db: str, runtime: FakeRuntime) -> AsyncIterator[Api]:
    async with running_app(make_settings(tmp_path, db_url=db), runtime) as a:
        yield a


async def new_volume(api: Api, name: str, size_mb: int = 64) -> dict[str, object]:
    r = await api.client.post("/v1/volumes", json={"name": name, "size_mb": size_mb})
    assert r.status_code == 201, r.text
    body: dict[str, object] = r.json()
    return body


async def new_sandbox(api: Api, *mounts: dict[str, object], status: int = 201,
                      code: str | None = None) -> dict[str, Any]:
    r = await api.client.post("/v1/sandboxes", json={"volumes": list(mounts)})
    if status != 201:
        assert_envelope(r, status, code)
        return {}
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


def mount(name: str, path: str = "/data", read_only: bool = False) -> dict[str, object]:
    return {"name": name, "mount_path": path, "read_only": read_only}


async def test_crud_and_team_scope(api: Api, runtime: FakeRuntime) -> None:
    c = api.client
    vol = await new_volume(api, "data")
    assert (vol["name"], vol["size_mb"], vol["attachments"]) == ("data", 64, [])
    assert vol["id"] in runtime.volumes
    assert_envelope(await c.post("/v1/volumes", json={"name": "data"}), 409, "conflict")
    assert [v["name"] for v in (await c.get("/v1/volumes")).json()["volumes"]] == ["data"]
    assert (await c.get("/v1/volumes/data")).json()["id"] == vol["id"]

    other = api.headers(await api.new_key("team-b", "b"))
    assert_envelope(await c.get("/v1/volumes/data", headers=other), 404, "not_found")
    assert_envelope(await c.delete("/v1/volumes/data", headers=other), 404, "not_found")
    assert_envelope(await c.post("/v1/volumes/data/resize", json={"size_mb": 128},
                                 headers=other), 404, "not_found")
    assert (await c.get("/v1/volumes", headers=other)).json() == {"volumes": []}
    r = await c.post("/v1/volumes", json={"name": "data"}, headers=other)  # its own "data"
    assert r.status_code == 201 and r.json()["id"] != vol["id"]

    r = await c.post("/v1/volumes/data/resize", json={"size_mb": 128})
    assert r.status_code == 200 and r.json()["size_mb"] == 128
    assert runtime.volumes[str(vol["id"])].size_mb == 128
    assert_envelope(await c.post("/v1/volumes/data/resize", json={"size_mb": 64}), 422)

    assert (await c.delete("/v1/volumes/data")).status_code == 204
    assert vol["id"] not in runtime.volumes
    assert_envelope(await c.get("/v1/volumes/data"), 404, "not_found")
    assert_envelope(await c.delete("/v1/volumes/data"), 404, "not_found")
    await new_volume(api, "data")  # the name is free again


async def test_bad_names_and_bodies_are_422_or_404_never_500(api: Api) -> None:
    c = api.client
    for body in ({"name": "Data"}, {"name": ""}, {"name": "x" * 64}, {"name": "a/b"},
                 {"name": "ok", "size_mb": 1}, {"name": "ok", "size_mb": 1 << 30},
                 {"name": "ok", "size_mb": "big"}, {"name": "ok", "extra": 1}, {}):
        assert_envelope(await c.post("/v1/volumes", json=body), 422)
    for name in ("Nope", "..", "x" * 64, "x" * 65, "%00", "a b"):
        assert_envelope(await c.get(f"/v1/volumes/{name}"), 404 if len(name) <= 64 else 422)
        r = await c.delete(f"/v1/volumes/{name}")
        assert r.status_code in (404, 422), r.text
    assert_envelope(await c.post("/v1/volumes/data/resize", json={"size_mb": 0}), 422)
    await new_volume(api, "data")
    for mounts in ([mount("data", "data")], [mount("data", "/")], [mount("data", "/a\x00b")],
                   [mount("data")] * 5, [{"name": "data"}],
                   [mount("data", "/a"), mount("data", "/b")],
                   [mount("data", "/a" * 600)], [{"name": "data", "mount_path": 7}]):
        r = await c.post("/v1/sandboxes", json={"volumes": mounts})
        assert_envelope(r, 422)
    assert (await c.get("/v1/volumes/data")).json()["attachments"] == []


async def test_one_writer_readers_share_and_end_detaches(api: Api,
                                                         runtime: FakeRuntime) -> None:
    c = api.client
    await new_volume(api, "data")
    await new_volume(api, "ref")
    await new_sandbox(api, mount("nope"), status=404, code="not_found")
    writer = await new_sandbox(api, mount("data"), mount("ref", "/ref", True))
    vol = (await c.get("/v1/volumes/data")).json()
    assert writer["volumes"] == [
        {"id": vol["id"], "name": "data", "mount_path": "/data", "read_only": False},
        {"id": (await c.get("/v1/volumes/ref")).json()["id"], "name": "ref",
         "mount_path": "/ref", "read_only": True}]
    assert [(m.volume_id, m.read_only) for m in runtime.sandbox(str(writer["id"])).volumes] \
        == [(vol["id"], False), ((await c.get("/v1/volumes/ref")).json()["id"], True)]
    assert (await c.get(f"/v1/sandboxes/{writer['id']}")).json()["volumes"] == writer["volumes"]
    assert vol["attachments"] == [{"sandbox_id": writer["id"], "mount_path": "/data",
                                   "read_only": False}]

    before = set(runtime.sandboxes)
    await new_sandbox(api, mount("data"), status=409, code="volume_in_use")
    await new_sandbox(api, mount("data", read_only=True), status=409, code="volume_in_use")
    assert set(runtime.sandboxes) == before  # refused before the host was asked
    reader = await new_sandbox(api, mount("ref", "/ref", True))  # readers share
    assert_envelope(await c.delete("/v1/volumes/data"), 409, "volume_in_use")
    assert_envelope(await c.post("/v1/volumes/data/resize", json={"size_mb": 128}), 409,
                    "volume_in_use")

    # Hibernation keeps the attachment; a kill drops it.
    assert (await c.post(f"/v1/sandboxes/{writer['id']}/hibernate")).status_code == 200
    await new_sandbox(api, mount("data"), status=409, code="volume_in_use")
    assert (await c.delete(f"/v1/sandboxes/{writer['id']}")).status_code == 204
    assert (await c.get("/v1/volumes/data")).json()["attachments"] == []
    second = await new_sandbox(api, mount("data", "/mnt/d"))
    assert [v["mount_path"] for v in second["volumes"]] == ["/mnt/d"]
    listed = (await c.get("/v1/sandboxes")).json()["sandboxes"]
    assert {s["id"]: len(s["volumes"]) for s in listed if s["state"] == "running"} == {
        reader["id"]: 1, second["id"]: 1}


async def test_a_failed_create_leaves_no_attachment(api: Api, runtime: FakeRuntime) -> None:
    await new_volume(api, "data")
    runtime.fail_create = ValueError("no room for it")
    await new_sandbox(api, mount("data"), status=422)
    runtime.fail_create = None
    assert (await api.client.get("/v1/volumes/data")).json()["attachments"] == []
    await new_sandbox(api, mount("data"))


async def test_fork_gives_children_copies_and_shares_readers(api: Api,
                                                             runtime: FakeRuntime) -> None:
    c = api.client
    data = await new_volume(api, "data")
    ref = await new_volume(api, "ref")
    parent = await new_sandbox(api, mount("data"), mount("ref", "/ref", True))
    r = await c.post(f"/v1/sandboxes/{parent['id']}/fork", json={"count": 2})
    assert r.status_code == 201, r.text
    for child in r.json()["sandboxes"]:
        copy_id = clone_volume_id(str(data["id"]), child["id"])
        assert child["volumes"] == [
            {"id": copy_id, "name": f"data-{child['id'][4:]}", "mount_path": "/data",
             "read_only": False},
            {"id": ref["id"], "name": "ref", "mount_path": "/ref", "read_only": True}]
        assert copy_id in runtime.volumes  # the host made it under the id the server named
        copy = (await c.get(f"/v1/volumes/data-{child['id'][4:]}")).json()
        assert (copy["source_volume"], copy["size_mb"]) == (data["id"], 64)
    names = sorted(v["name"] for v in (await c.get("/v1/volumes")).json()["volumes"])
    assert len(names) == 4 and names[0] == "data" and names[-1] == "ref"
    # A copy is a volume of its own: its child's end frees it.
    child = r.json()["sandboxes"][0]
    assert_envelope(await c.delete(f"/v1/volumes/data-{child['id'][4:]}"), 409, "volume_in_use")
    assert (await c.delete(f"/v1/sandboxes/{child['id']}")).status_code == 204
    assert (await c.delete(f"/v1/volumes/data-{child['id'][4:]}")).status_code == 204


async def test_snapshot_records_volumes_and_a_restore_gets_them(api: Api) -> None:
    c = api.client
    data = await new_volume(api, "data")
    ref = await new_volume(api, "ref")
    src = await new_sandbox(api, mount("data"), mount("ref", "/ref", True))
    snap = (await c.post(f"/v1/sandboxes/{src['id']}/snapshots", json={})).json()
    r = await c.post("/v1/sandboxes", json={"snapshot": snap["id"],
                                            "volumes": [mount("data", "/x")]})
    assert_envelope(r, 422, "validation_error")
    r = await c.post("/v1/sandboxes", json={"snapshot": snap["id"]})
    assert r.status_code == 201, r.text
    restored = r.json()
    assert restored["volumes"] == [
        {"id": clone_volume_id(str(data["id"]), restored["id"]),
         "name": f"data-{restored['id'][4:]}", "mount_path": "/data", "read_only": False},
        {"id": ref["id"], "name": "ref", "mount_path": "/ref", "read_only": True}]

    # A recorded reader that has a writer now: 409; that is gone: 404.
    for sid in (src["id"], restored["id"]):
        assert (await c.delete(f"/v1/sandboxes/{sid}")).status_code == 204
    writer = await new_sandbox(api, mount("ref"))
    assert_envelope(await c.post("/v1/sandboxes", json={"snapshot": snap["id"]}), 409,
                    "volume_in_use")
    assert (await c.delete(f"/v1/sandboxes/{writer['id']}")).status_code == 204
    assert (await c.delete("/v1/volumes/ref")).status_code == 204
    assert_envelope(await c.post("/v1/sandboxes", json={"snapshot": snap["id"]}), 404,
                    "not_found")
    # A recorded writer deleted since is fine: the snapshot holds its copy.
    assert (await c.delete("/v1/volumes/data")).status_code == 204


async def test_volume_quota(api: Api) -> None:
    r = await api.client.put("/v1/teams/default/quota", json={"max_volume_gb": 1})
    assert r.status_code == 200, r.text
    await new_volume(api, "a", 512)
    for r in (await api.client.post("/v1/volumes", json={"name": "b", "size_mb": 1024}),
              await api.client.post("/v1/volumes/a/resize", json={"size_mb": 2048})):
        assert r.status_code == 429, r.text
        assert r.json()["error"]["code"] == "quota_exceeded"
        assert r.json()["error"]["limit"] == "max_volume_gb"
    assert (await api.client.get("/v1/volumes/a")).json()["size_mb"] == 512
    assert [v["name"] for v in (await api.client.get("/v1/volumes")).json()["volumes"]] == ["a"]


async def test_a_pool_places_sandboxes_where_their_volumes_are(tmp_path: Path, db: str) -> None:
    from pandastack.server.hosts.pool import HostPool
    hosts = {"host-a": FakeRuntime(tmp_path / "a"), "host-b": FakeRuntime(tmp_path / "b")}
    async with running_app(make_settings(tmp_path, db_url=db), HostPool(hosts)) as api:
        made = [await new_volume(api, f"v{i}") for i in range(4)]
        for vol in made:  # the pool chose a host; the server keeps it
            assert vol["host_id"] in hosts and vol["id"] in hosts[str(vol["host_id"])].volumes
        for vol in made:
            sbx = await new_sandbox(api, mount(str(vol["name"])))
            assert sbx["id"] in hosts[str(vol["host_id"])].sandboxes
        # Two volumes on different hosts cannot go in one sandbox.
        other = "host-b" if made[1]["host_id"] == "host-a" else "host-a"
        api.app.state.service.store.set_volume_host(made[1]["id"], other)
        await new_sandbox(api, mount("v0", "/a", True), mount("v1", "/b", True), status=422,
                          code="validation_error")
        r = await api.client.post("/v1/volumes", json={"name": "pinned", "host_id": "host-a"})
        assert_envelope(r, 422, "validation_error")  # one server, no cluster: no choosing


async def test_portable_volume_calls_on_one_host_without_an_object_store(api: Api) -> None:
    c = api.client
    await new_volume(api, "data")
    # The host has no object store: a clear 409 that says what to set, never a 500.
    r = await c.post("/v1/volumes/data/snapshots")
    assert_envelope(r, 409, "conflict")
    assert "PANDASTACK_OBJECT_STORE" in r.json()["error"]["message"]
    assert (await c.get("/v1/volume-snapshots")).json() == {"snapshots": []}
    # One host: nowhere to move to.
    assert_envelope(await c.post("/v1/volumes/data/move", json={"host_id": "h-1"}), 422,
                    "validation_error")
    assert_envelope(await c.post("/v1/volumes/nope/snapshots"), 404, "not_found")
    for snapshot in ("vsnap-000000000000", "../x", "snap-000000000000"):
        assert_envelope(await c.post("/v1/volumes", json={"name": "v",
                                                           "from_snapshot": snapshot}),
                        404, "not_found")
        assert_envelope(await c.get(f"/v1/volume-snapshots/{snapshot}"), 404, "not_found")
    # Nothing was made by the refused creates.
    assert [v["name"] for v in (await c.get("/v1/volumes")).json()["volumes"]] == ["data"]
