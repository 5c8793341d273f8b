"""Volumes through the SDK against a live `pandastack serve` on real VMs (one server process for
the module, restarted in the middle): a file written to a volume by one sandbox is read by a
later one after the first is killed and after a server restart; a fork's child reads it from
its own copy (named in the fork's answer) and the parent's volume does not see the child's
writes; two sandboxes mount one volume read-only at once; delete while attached, a second
writer, and an unknown volume on create are refused (409, 409, 404)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

import pytest

from pandastack.sdk import Client, NotFoundError, PandastackError, Sandbox, VolumeInUseError
from tests.e2e.test_server_restart import ServeProcess, started_serve

pytestmark = [pytest.mark.vm, pytest.mark.e2e]

DATA = {"name": "data", "mount_path": "/data", "read_only": False}


@pytest.fixture(scope="module")
def serve() -> Iterator[ServeProcess]:
    with started_serve("psv-") as server:
        yield server


def read(sbx: Sandbox, path: str) -> str:
    return sbx.filesystem.read(path).decode()


def test_a_volume_outlives_sandboxes_a_restart_and_forks(serve: ServeProcess) -> None:
    made: list[Sandbox] = []

    def create(client: Client, *mounts: dict[str, object]) -> Sandbox:
        sbx = client.sandboxes.create(volumes=list(mounts), ttl_seconds=900)
        made.append(sbx)
        return sbx

    client = Client(serve.url, serve.api_key(), timeout=300)
    try:
        client.volumes.create("data", size_mb=64)
        with pytest.raises(NotFoundError):
            client.sandboxes.create(volumes=[{"name": "nope", "mount_path": "/data"}])

        first = create(client, DATA)
        assert [(v.name, v.mount_path, v.read_only) for v in first.info.volumes] == [
            ("data", "/data", False)]
        first.filesystem.write("/data/hello.txt", "written by the first")
        with pytest.raises(VolumeInUseError):  # a second writer
            client.sandboxes.create(volumes=[DATA])
        with pytest.raises(VolumeInUseError):
            client.volumes.delete("data")
        first.kill()

        second = create(client, DATA)
        assert read(second, "/data/hello.txt") == "written by the first"
        second.filesystem.write("/data/second.txt", "and by the second")
        second.kill()

        client.close()
        serve.signal(signal.SIGTERM)
        serve.start(timeout=300)
        client = Client(serve.url, serve.api_key(), timeout=300)
        assert client.volumes.get("data").attachments == []

        parent = create(client, DATA)
        assert read(parent, "/data/second.txt") == "and by the second"
        [child] = parent.fork()
        made.append(child)
        [copy] = child.info.volumes
        assert (copy.mount_path, copy.read_only) == ("/data", False)
        assert copy.name == f"data-{child.id.removeprefix('sbx-')}"
        assert client.volumes.get(copy.name).source_volume == client.volumes.get("data").id
        assert read(child, "/data/hello.txt") == "written by the first"
        child.filesystem.write("/data/child.txt", "the child's")
        assert not parent.filesystem.exists("/data/child.txt")
        child.kill()
        parent.kill()
        client.volumes.delete(copy.name)

        readers = [create(client, {**DATA, "read_only": True}) for _ in range(2)]
        for r in readers:
            assert read(r, "/data/hello.txt") == "written by the first"
            assert not r.filesystem.exists("/data/child.txt")
        with pytest.raises(VolumeInUseError):  # a writer waits for the readers
            client.sandboxes.create(volumes=[DATA])
        for r in readers:
            r.kill()
        client.volumes.delete("data")
        assert client.volumes.list() == []
    finally:
        for sbx in made:
            with contextlib.suppress(PandastackError):  # killing twice is fine
                sbx.kill()
        with contextlib.suppress(PandastackError):
            for vol in client.volumes.list():
                client.volumes.delete(vol.name)
        client.close()
