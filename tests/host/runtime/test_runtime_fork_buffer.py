"""Forks write their streams into the warm fork buffer (ADR 0010), on real VMs."""

from __future__ import annotations

import asyncio
import time

import pytest

from pandastack.host.config import HostConfig
from pandastack.host.runtime import HostRuntime
from pandastack.host.runtime.sandbox import SandboxHandle
from pandastack.host.vmm.driver import max_stream_bytes
from tests.helpers import close_private_runtime
from tests.leftovers import owned_tmpdir

pytestmark = pytest.mark.vm

# Fills guest memory with non-zero pages, so this sandbox's stream is much longer than that
# of a fresh one; then holds it and answers `ready`.
FILL = """
import sys
blob = bytearray(int(sys.argv[1]) << 20)
for i in range(0, len(blob), 4096):
    blob[i] = 1
open('/work/filled', 'w').write('ok')
import time
while True:
    time.sleep(3600)
"""


async def _filled(sbx: SandboxHandle, mb: int) -> None:
    await sbx.write_file("/work/fill.py", FILL.encode())
    await sbx.spawn(["python3", "/work/fill.py", str(mb)])
    deadline = time.monotonic() + 120
    while (await sbx.exec("test -e /work/filled")).exit_code != 0:
        assert time.monotonic() < deadline, "the filling process did not finish"
        await asyncio.sleep(0.3)


async def _buffer_ready(rt: HostRuntime) -> None:
    deadline = time.monotonic() + 120
    while rt.fork_buffer.state != "idle":
        assert rt.fork_buffer.state == "warming", rt.fork_buffer.state
        assert time.monotonic() < deadline, "the fork buffer was never ready"
        await asyncio.sleep(0.1)


async def test_fork_streams_go_through_the_buffer_and_a_stale_tail_is_harmless(
        host_config: HostConfig) -> None:
    state = owned_tmpdir("psfb-")
    snaps = owned_tmpdir("psfb-snap-")
    config = HostConfig(home=host_config.home, state_dir=state, snapshots_root=snaps,
                        fork_buffer_s=300)
    rt = HostRuntime(config, progress=lambda m: None)
    await rt.start()
    try:
        big = await rt.create()
        await _filled(big, 96)
        # The first fork finds no buffer: its stream goes to the snapshot directory, and a
        # buffer is prepared for the next one, with all the space a fork of this size
        # reserves already written (else that fork would allocate the rest itself).
        (first,) = await rt.fork(big.id)
        await rt.kill(first.id)
        await _buffer_ready(rt)
        assert config.fork_buffer_dir.is_dir()
        assert rt.fork_buffer.path.stat().st_blocks * 512 >= max_stream_bytes(512 << 20)

        snap = await rt.snapshot(big.id, internal=True, transient=True, short_pause=False)
        stream = rt.snapshots.stream(snap.info.id)
        assert rt.fork_buffer.holds(stream) and rt.fork_buffer.state == "taken"
        big_bytes = snap.info.state_bytes
        assert big_bytes > 96 << 20
        rt.delete_snapshot(snap.info.id)
        assert rt.fork_buffer.state == "idle"

        # A fresh sandbox's stream is far shorter: written over the big one, it leaves the
        # big stream's tail in the buffer. Its copies must restore all the same.
        small = await rt.create()
        await small.write_file("/work/mark", b"small")
        await small.spawn(["sleep", "600"])
        snap = await rt.snapshot(small.id, internal=True, transient=True, short_pause=False)
        assert rt.fork_buffer.holds(rt.snapshots.stream(snap.info.id))
        assert snap.info.state_bytes < big_bytes // 2
        assert rt.fork_buffer.path.stat().st_size >= big_bytes
        child = await rt.create(snapshot=snap.info.id)
        rt.delete_snapshot(snap.info.id)
        assert (await child.exec("cat /work/mark")).stdout == b"small"
        assert (await child.exec("pgrep -x sleep")).exit_code == 0
        await rt.kill(child.id)

        # And fork() itself takes the buffer and gives it back once its children run.
        kids = await rt.fork(small.id, count=2)
        assert rt.fork_buffer.state == "idle"
        for kid in kids:
            assert (await kid.exec("cat /work/mark")).stdout == b"small"
    finally:
        leftovers = await close_private_runtime(rt, state, snaps)
    assert not config.fork_buffer_dir.exists(), "the buffer's mount outlived the runtime"
    assert leftovers == ([], [])


async def test_a_forks_snapshot_left_by_a_crash_is_swept_at_start(
        host_config: HostConfig) -> None:
    """A fork deletes its snapshot once its children run; if the host process died in
    between, the next start removes it (and its stream link into the buffer, now gone)."""
    state = owned_tmpdir("psfb-")
    snaps = owned_tmpdir("psfb-snap-")
    config = HostConfig(home=host_config.home, state_dir=state, snapshots_root=snaps)
    first = HostRuntime(config, progress=lambda m: None)
    await first.start()
    sbx = await first.create()
    kept = await first.snapshot(sbx.id)
    left = await first.snapshot(sbx.id, internal=True, transient=True, short_pause=False)
    await first.close()  # as if it died here: the VM runs on, the snapshot stays
    rt = HostRuntime(config, progress=lambda m: None)
    try:
        report = await rt.start()
        assert report.adopted == [sbx.id]
        ids = {i.id for i in rt.snapshots.all(include_internal=True)}
        assert ids == {kept.info.id}, "the fork's snapshot outlived the crash"
        assert not (snaps / left.info.id).exists()
    finally:
        leftovers = await close_private_runtime(rt, state, snaps)
    assert leftovers == ([], [])
