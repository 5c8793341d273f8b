"""Durable volumes on real VMs (ADR 0027): mounted at create without giving up the restore,
one writer or many readers, kept across hibernation, copied for a fork's children."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import pytest

from pandastack.host.runtime import HostRuntime
from pandastack.hostport.errors import VolumeInUse, VolumeNotFound
from pandastack.hostport.volumes import VolumeMountRequest
from pandastack.rules import clone_volume_id, new_volume_id
from tests.helpers import SandboxFactory

pytestmark = pytest.mark.vm


@pytest.fixture
async def volume(runtime: HostRuntime) -> AsyncIterator[str]:
    volume_id = new_volume_id()
    await runtime.volumes.create(volume_id, 64)
    yield volume_id
    for held in {sid for sid, _ in runtime.volumes.holders(volume_id)}:
        await runtime.kill(held)
    for left in await runtime.volumes.all():
        if left.id == volume_id or left.source == volume_id:
            await runtime.volumes.delete(left.id)


async def _read_image(runtime: HostRuntime, volume: str, needle: bytes) -> bytes:
    """`needle` if the volume's image holds it (what its guest flushed), else b""."""
    data = runtime.volumes.store.image(volume).read_bytes()
    return needle if needle in data else b""


async def _sh(sbx: object, script: str) -> str:
    result = await sbx.exec(["sh", "-c", script])  # type: ignore[attr-defined]
    assert result.exit_code == 0, result
    return str(result.stdout.decode())


async def test_written_then_read_by_later_sandboxes(runtime: HostRuntime, volume: str,
                                                    sandbox_factory: SandboxFactory) -> None:
    token = secrets.token_hex(8)
    writer = await sandbox_factory(volumes=[VolumeMountRequest(volume, "/data")])
    assert "/data" in await _sh(writer, "grep ' /data ' /proc/mounts")
    size_kb = int((await _sh(writer, "df -k --output=size /data | tail -1")).strip())
    assert 50_000 < size_kb <= 65_536  # the volume's 64 MiB, not the empty slot's 0
    await _sh(writer, f"echo {token} > /data/token")  # no sync: the kill flushes it
    with pytest.raises(VolumeInUse):  # a second writer
        await sandbox_factory(volumes=[VolumeMountRequest(volume, "/data")])
    with pytest.raises(VolumeInUse):  # a reader while it has a writer
        await sandbox_factory(volumes=[VolumeMountRequest(volume, "/v", read_only=True)])
    with pytest.raises(VolumeInUse):
        await runtime.volumes.delete(volume)
    await runtime.kill(writer.id)
    assert (await runtime.volumes.get(volume)).attached_to == ()

    readers = [await sandbox_factory(volumes=[VolumeMountRequest(volume, "/v", read_only=True)])
               for _ in range(2)]
    for reader in readers:
        assert (await _sh(reader, "cat /v/token")).strip() == token
        denied = await reader.exec(["sh", "-c", "echo x > /v/other"])
        assert denied.exit_code != 0 and b"Read-only" in denied.stderr
    with pytest.raises(VolumeInUse):  # a writer while it has readers
        await sandbox_factory(volumes=[VolumeMountRequest(volume, "/data")])
    with pytest.raises(VolumeInUse):
        await runtime.volumes.resize(volume, 128)
    for reader in readers:
        await runtime.kill(reader.id)

    grown = await runtime.volumes.resize(volume, 128)
    assert grown.size_mb == 128
    again = await sandbox_factory(volumes=[VolumeMountRequest(volume, "/data")])
    assert (await _sh(again, "cat /data/token")).strip() == token
    size_kb = int((await _sh(again, "df -k --output=size /data | tail -1")).strip())
    assert size_kb > 100_000  # the file system followed the image


async def test_unknown_volume_and_bad_mounts_are_refused(runtime: HostRuntime, volume: str,
                                                         sandbox_factory: SandboxFactory
                                                         ) -> None:
    with pytest.raises(VolumeNotFound):
        await sandbox_factory(volumes=[VolumeMountRequest(new_volume_id(), "/data")])
    with pytest.raises(ValueError):
        await sandbox_factory(volumes=[VolumeMountRequest(volume, "/a"),
                                       VolumeMountRequest(volume, "/b", read_only=True)])
    assert runtime.volumes.holders(volume) == []


async def test_hibernation_keeps_the_mount(runtime: HostRuntime, volume: str,
                                           sandbox_factory: SandboxFactory) -> None:
    sbx = await sandbox_factory(volumes=[VolumeMountRequest(volume, "/data")])
    await _sh(sbx, "echo before > /data/f")
    await runtime.hibernate(sbx.id)
    assert b"before" in await _read_image(runtime, volume, b"before")
    assert runtime.volumes.holders(volume) == [(sbx.id, False)]
    with pytest.raises(VolumeInUse):  # hibernated, its memory still has it mounted
        await sandbox_factory(volumes=[VolumeMountRequest(volume, "/data")])
    await runtime.wake(sbx.id)
    assert (await _sh(sbx, "cat /data/f; echo after >> /data/f; cat /data/f")).split() == \
        ["before", "before", "after"]


async def test_fork_children_get_copies(runtime: HostRuntime, volume: str,
                                        sandbox_factory: SandboxFactory) -> None:
    parent = await sandbox_factory(volumes=[VolumeMountRequest(volume, "/data")])
    await _sh(parent, "echo parent > /data/who")
    children = await runtime.fork(parent.id, 2)
    try:
        for child in children:
            clone = clone_volume_id(volume, child.id)
            assert runtime.volumes.holders(clone) == [(child.id, False)]
            assert (await runtime.volumes.get(clone)).source == volume
            assert (await _sh(child, "cat /data/who")).strip() == "parent"
            await _sh(child, f"echo {child.id} > /data/who && sync")
        assert (await _sh(parent, "cat /data/who")).strip() == "parent"
        assert (await _sh(children[0], "cat /data/who")).strip() == children[0].id
    finally:
        for child in children:
            await runtime.kill(child.id)


async def test_a_one_child_fork_takes_the_snapshot_copy(runtime: HostRuntime, volume: str,
                                                         sandbox_factory: SandboxFactory
                                                         ) -> None:
    parent = await sandbox_factory(volumes=[VolumeMountRequest(volume, "/data")])
    await _sh(parent, "echo one > /data/who")
    (child,) = await runtime.fork(parent.id, 1)
    try:
        assert (await _sh(child, "cat /data/who")).strip() == "one"
        assert runtime.volumes.handed_over == set()
        await _sh(child, "echo child > /data/who")
        assert (await _sh(parent, "cat /data/who")).strip() == "one"
    finally:
        await runtime.kill(child.id)
