"""The fork buffer on its own: a real tmpfs mount with 2 MiB pages, prepared, lent, given back,
released after its keep time, and swept after a crash. No VM needed (root for the mount)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pandastack.host.memory.fork_buffer import ForkBuffer

pytestmark = pytest.mark.timeout(60)


def _mount_options(mountpoint: Path) -> list[str] | None:
    with open("/proc/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if fields[1] == str(mountpoint):
                return fields[3].split(",")
    return None


async def _ready(buffer: ForkBuffer) -> None:
    for _ in range(300):
        if buffer.state != "warming":
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the buffer was never ready")


@pytest.fixture
async def buffer(tmp_path: Path) -> AsyncIterator[ForkBuffer]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    buf = ForkBuffer(tmp_path / "mnt", keep_s=30, progress=lambda m: None)
    yield buf
    await buf.close()
    assert _mount_options(tmp_path / "mnt") is None
    assert not (tmp_path / "mnt").exists()


async def test_prepared_buffer_is_lent_once_and_given_back(buffer: ForkBuffer) -> None:
    assert buffer.take(1 << 20) is None  # nothing prepared yet
    buffer.prepare(3 << 20)
    assert buffer.state == "warming"
    assert buffer.take(1 << 20) is None  # not while it is being prepared
    await _ready(buffer)
    assert buffer.state == "idle"
    options = _mount_options(buffer.mountpoint)
    assert options is not None and "huge=always" in options
    assert buffer.path.stat().st_size == 4 << 20  # whole 2 MiB pages, written
    path = buffer.take(5 << 20)
    assert path == buffer.path and buffer.state == "taken"
    assert buffer.path.stat().st_size == 5 << 20  # the reserve is allocated
    assert buffer.take(1 << 20) is None  # one fork at a time
    buffer.give_back()
    assert buffer.state == "idle"
    buffer.prepare(1 << 20)  # one buffer at a time: this is a no-op
    assert buffer.take(1 << 20) == buffer.path


async def test_buffer_unused_for_its_keep_time_is_released(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    buf = ForkBuffer(tmp_path / "mnt", keep_s=0.3, progress=lambda m: None)
    try:
        buf.prepare(1 << 20)
        await _ready(buf)
        assert buf.take(1 << 20) is not None
        await asyncio.sleep(0.6)
        assert buf.state == "taken"  # never released while a fork holds it
        buf.give_back()
        await asyncio.sleep(0.6)
        assert buf.state == "none"
        assert _mount_options(tmp_path / "mnt") is None and not (tmp_path / "mnt").exists()
    finally:
        await buf.close()


async def test_reserve_that_does_not_fit_releases_the_buffer(buffer: ForkBuffer) -> None:
    buffer.prepare(1 << 20)
    await _ready(buffer)
    assert buffer.take(1 << 60) is None
    assert buffer.state == "none" and _mount_options(buffer.mountpoint) is None


async def test_disabled_buffer_is_never_prepared(tmp_path: Path) -> None:
    buf = ForkBuffer(tmp_path / "mnt", keep_s=0, progress=lambda m: None)
    buf.prepare(1 << 20)
    assert buf.state == "none" and not (tmp_path / "mnt").exists()


def test_sweep_removes_what_a_dead_runtime_left(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mountpoint)], check=True)
    (mountpoint / "stream").write_bytes(b"left")
    ForkBuffer(mountpoint, keep_s=30).sweep()
    assert _mount_options(mountpoint) is None and not mountpoint.exists()


async def test_close_stops_a_buffer_being_prepared(buffer: ForkBuffer) -> None:
    buffer.prepare(256 << 20)
    await asyncio.sleep(0.05)
    await buffer.close()
    assert buffer.state == "none"


async def test_a_buffer_that_cannot_be_made_is_not_retried_at_every_fork(
        tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    said: list[str] = []
    buf = ForkBuffer(tmp_path / "file" / "mnt", keep_s=30, progress=said.append)
    buf.prepare(1 << 20)
    await _ready(buf)
    assert buf.state == "none" and len(said) == 1 and "cannot prepare" in said[0]
    buf.prepare(1 << 20)
    assert buf.state == "none"  # not again right away
    await buf.close()
    assert len(said) == 1
