"""A runtime starting after its predecessor died in the middle of an operation
(host/runtime/recovery.py), on the fake VMM driver: a VM left stopped by a save or a fork is
running again, and a wake cut short (its VM runs, its record still says hibernated) ends
`running` with the hibernation file gone. bench/chaos.py found both on real VMs: after a
server SIGKILL during a fork the source's agent never answered again, and after one during a
wake every call on the sandbox failed."""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from pathlib import Path

import pytest

from pandastack.host.config import HostConfig
from pandastack.host.runtime.records import HIBERNATION, SandboxRecord
from tests.helpers import close_private_runtime
from tests.host.runtime.test_runtime_fake_vmm import config, driver_of, new_runtime, root

pytestmark = pytest.mark.timeout(120)
__all__ = ["config", "root"]  # fixtures


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


async def test_a_vm_left_stopped_by_a_dead_runtime_runs_again(config: HostConfig) -> None:
    first = new_runtime(config)
    await first.start()
    try:
        sbx = await first.create()
        assert sbx.pid is not None
        os.kill(sbx.pid, signal.SIGSTOP)  # as a save stops the guest, then its driver died
    finally:
        await first.close()
    second = new_runtime(config)
    try:
        await second.start()
        assert "settle" in driver_of(second).calls
        adopted = second.get(sbx.id)
        assert adopted.state == "running" and _state(sbx.pid) != "T"
        assert (await adopted.exec(["echo", "on"])).stdout == b"on\n"
    finally:
        left = await close_private_runtime(second, config.sandboxes_dir, config.snapshots_dir)
    assert left == ([], []), left


async def test_a_wake_cut_short_ends_running_not_beside_a_second_restore(
        config: HostConfig) -> None:
    first = new_runtime(config)
    await first.start()
    try:
        sbx = await first.create()
        record_path = sbx.workdir / "sandbox.json"
        # What a wake leaves when its runtime dies after the VM was restored and before
        # the record said running: the record hibernated, the file still there.
        replace(SandboxRecord.load(record_path), state="hibernated").save(record_path)
        (sbx.workdir / HIBERNATION).write_bytes(b"state")
    finally:
        await first.close()
    second = new_runtime(config)
    try:
        await second.start()
        woken = second.get(sbx.id)
        assert (woken.state, woken.pid) == ("running", sbx.pid)
        assert SandboxRecord.load(record_path).state == "running"
        assert not (sbx.workdir / HIBERNATION).exists()
        assert (await woken.exec(["echo", "awake"])).stdout == b"awake\n"
    finally:
        left = await close_private_runtime(second, config.sandboxes_dir, config.snapshots_dir)
    assert left == ([], []), left


async def test_a_restarted_runtime_holds_the_template_versions_its_sandboxes_need(
        config: HostConfig) -> None:
    """A hibernated sandbox's template version is loaded again only at its wake: until then
    another runtime's template GC on the host removed it (bench/chaos.py: 'template base at
    ... is gone' on waking after a server restart)."""
    from pandastack.host import gc

    first = new_runtime(config)
    await first.start()
    try:
        sbx = await first.create()
        await first.hibernate(sbx.id)
        version = Path(SandboxRecord.load(sbx.workdir / "sandbox.json").template_path)
    finally:
        await first.close()
    gc._HELD.pop(str(version.resolve()), None)  # as in a new process
    second = new_runtime(config)
    try:
        await second.start()
        assert str(version.resolve()) in gc._HELD
    finally:
        left = await close_private_runtime(second, config.sandboxes_dir, config.snapshots_dir)
    assert left == ([], []), left
