"""Portable volumes on two real agents, microVMs, PostgreSQL and the real S3 server: a
sandbox's snapshot carries its volume's copy to the other host; a volume snapshot holds what a
killed sandbox wrote and makes a new volume on the other host (grown);
a move takes a volume to the other host with its data, and the next sandbox that mounts it
lands there; a move that a server left half-done is undone when it starts again; nothing is
left on either host."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import httpx
import pytest

from tests.server.conftest import Api, assert_envelope
from tests.server.hosts.cluster_rig import (
    CALM_STALE_S,
    agents,
    api_servers,
    host_ids,
    registry_of,
)
from tests.server.hosts.test_cluster_objects import ok, run, store_url

# No host is lost here: its agents are stale only after 60 s (CALM_STALE_S), so a heartbeat
# late beside a second test worker's VMs fences nothing, and it runs in the parallel lane
# (with 3 s it did fence a host mid-test there; it was serial until issue 33).
pytestmark = pytest.mark.vm

MiB = 1 << 20


def volume_dirs(volumes_dir: Path) -> list[str]:
    return sorted(p.name for p in volumes_dir.iterdir()) if volumes_dir.exists() else []


async def mount(api: Api, name: str, **body: object) -> dict[str, object]:
    return await ok(await api.client.post("/v1/sandboxes", json={
        "volumes": [{"name": name, "mount_path": "/data"}], **body}), 201)


async def gone(r: httpx.Response) -> None:
    assert r.status_code == 204, r.text


async def kill(api: Api, sid: object) -> None:
    await gone(await api.client.delete(f"/v1/sandboxes/{sid}"))


async def test_volume_snapshots_and_moves_across_hosts(pg_dsn: str, tmp_path: Path,
                                                       s3_env: dict[str, str]) -> None:
    with registry_of(pg_dsn) as registry:
        async with agents(pg_dsn, 2, object_store=store_url(s3_env),
                          stale_s=CALM_STALE_S) as (a, b), \
                api_servers(tmp_path, pg_dsn, a.token_file, stale_s=CALM_STALE_S) as (one, two):
            id_a, id_b = host_ids(registry, [a, b])
            vol = await ok(await one.client.post("/v1/volumes", json={
                "name": "data", "size_mb": 256, "host_id": id_a}), 201)
            sbx = await mount(one, "data")
            assert sbx["host_id"] == id_a
            await run(one, str(sbx["id"]), "head -c 3000000 /dev/urandom > /data/blob && "
                                           "echo kept > /data/note")
            digest = await run(one, str(sbx["id"]), "sha256sum /data/blob")

            # A writer holds it: no snapshot, no move.
            r = await two.client.post("/v1/volumes/data/snapshots")
            assert_envelope(r, 409, "volume_in_use")
            r = await two.client.post("/v1/volumes/data/move", json={"host_id": id_b})
            assert_envelope(r, 409, "volume_in_use")
            # A sandbox's snapshot takes its volume's copy along: made of it on B, the new
            # sandbox gets that copy there (a volume of the team, on B).
            taken = await ok(await one.client.post(f"/v1/sandboxes/{sbx['id']}/snapshots",
                                                   json={"name": "with-volume"}), 201)
            twin = await ok(await two.client.post("/v1/sandboxes", json={
                "snapshot": taken["id"], "host_id": id_b}), 201)
            assert twin["host_id"] == id_b
            assert await run(two, str(twin["id"]), "sha256sum /data/blob") == digest
            clone = twin["volumes"][0]  # type: ignore[index]
            got = await ok(await two.client.get(f"/v1/volumes/{clone['name']}"))
            assert (got["host_id"], got["source_volume"]) == (id_b, vol["id"])
            assert clone["id"] in volume_dirs(b.volumes_dir)
            await kill(two, twin["id"])
            await gone(await two.client.delete(f"/v1/volumes/{clone['name']}"))
            await gone(await one.client.delete(f"/v1/snapshots/{taken['id']}"))
            await kill(one, sbx["id"])

            snap = await ok(await two.client.post("/v1/volumes/data/snapshots"), 201)
            assert snap["volume_name"] == "data" and snap["size_mb"] == 256
            # The data (3 MB of noise, and the 4 MiB chunks that hold ext4's metadata: the
            # groups with superblock copies, the journal), not the whole image.
            stored = int(snap["stored_bytes"])  # type: ignore[call-overload]
            assert 3_000_000 <= stored < 128 * MiB
            listed = await ok(await one.client.get("/v1/volume-snapshots",
                                                   params={"volume": "data"}))
            snapshots = cast(list[dict[str, object]], listed["snapshots"])  # the API's shape
            assert [s["id"] for s in snapshots] == [snap["id"]]

            # A new volume of it, on the other host, larger: the file system grew.
            copy = await ok(await one.client.post("/v1/volumes", json={
                "name": "copy", "from_snapshot": snap["id"], "size_mb": 320,
                "host_id": id_b}), 201)
            assert (copy["host_id"], copy["size_mb"], copy["source_volume"]) == \
                (id_b, 320, vol["id"])
            sbx = await mount(two, "copy")
            assert sbx["host_id"] == id_b
            assert await run(two, str(sbx["id"]), "sha256sum /data/blob") == digest
            size = await run(two, str(sbx["id"]), "df -k --output=size /data | tail -1")
            assert int(size) > 280 * 1024
            await kill(two, sbx["id"])

            # The move: same id and name, now on B, with its data; A keeps nothing of it.
            moved = await ok(await two.client.post("/v1/volumes/data/move",
                                                   json={"host_id": id_b}))
            assert (moved["id"], moved["host_id"]) == (vol["id"], id_b)
            assert vol["id"] not in volume_dirs(a.volumes_dir)
            assert vol["id"] in volume_dirs(b.volumes_dir)
            sbx = await mount(one, "data")
            assert sbx["host_id"] == id_b
            assert await run(one, str(sbx["id"]), "cat /data/note; sha256sum /data/blob") == \
                "kept\n" + digest
            await kill(one, sbx["id"])

            # A move a server left half-done (marked, not switched): attaching is refused
            # until a start undoes it; the volume stays where it was.
            service = one.app.state.service
            service.store.begin_volume_move(vol["id"], id_a)
            r = await two.client.post("/v1/sandboxes", json={
                "volumes": [{"name": "data", "mount_path": "/data"}]})
            assert_envelope(r, 409, "volume_in_use")
            await service.volumes.snapshots.finish_moves()
            got = await ok(await two.client.get("/v1/volumes/data"))
            assert got["host_id"] == id_b
            sbx = await mount(two, "data")
            await kill(two, sbx["id"])

            # Errors are clear: an unknown host, a tenant key, a snapshot of another team.
            r = await one.client.post("/v1/volumes/data/move", json={"host_id": "h-nope"})
            assert_envelope(r, 422, "validation_error")
            key = await one.new_key("other")
            r = await one.client.post("/v1/volumes/data/move", json={"host_id": id_a},
                                      headers=one.headers(key))
            assert_envelope(r, 403, "forbidden")
            r = await one.client.get(f"/v1/volume-snapshots/{snap['id']}",
                                     headers=one.headers(key))
            assert_envelope(r, 404, "not_found")
            r = await one.client.post("/v1/volumes", json={
                "name": "x", "from_snapshot": snap["id"]}, headers=one.headers(key))
            assert_envelope(r, 404, "not_found")

            await gone(await one.client.delete(f"/v1/volume-snapshots/{snap['id']}"))
            listed = await ok(await one.client.get("/v1/volume-snapshots"))
            assert listed["snapshots"] == []
            for name in ("data", "copy"):
                await gone(await one.client.delete(f"/v1/volumes/{name}"))
            assert volume_dirs(a.volumes_dir) == volume_dirs(b.volumes_dir) == []

