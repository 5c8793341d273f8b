"""A template baked on the machine with the PIT (every template before ADR 0040) still
restores once the driver's own machine has none: the restore uses the machine its template
was baked on, or QEMU refuses the stream (it carries the PIT's state). Real VMs."""

from __future__ import annotations

import asyncio
import copy
import shutil
import tempfile
from pathlib import Path

import pytest

from pandastack.host.agentlink.client import AgentClient
from pandastack.host.runtime import HostRuntime
from pandastack.host.templates import builtin
from pandastack.host.templates.builtin import TemplateStore
from pandastack.host.vmm.driver import VMPaths
from pandastack.host.vmm.qemu import MACHINE, QemuDriver
from pandastack.host.vmm.qemu.qcow2 import create_overlay
from pandastack.hostport.network import NetworkPolicy

pytestmark = pytest.mark.vm


@pytest.mark.timeout(600)
async def test_a_template_baked_with_the_pit_restores_on_the_new_driver(
        runtime: HostRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    driver = runtime.driver
    if not isinstance(driver, QemuDriver) or driver.accel != "tcg":
        pytest.skip("the PIT is left out under TCG only")
    await runtime.prepare()
    # A store's bake prunes the guest images no template under its own root was baked from:
    # from this private root that would remove the shared images every other test's
    # templates are layered on (they were rebuilt under those templates: "Bad message").
    monkeypatch.setattr(builtin, "prune_images", lambda *args, **kwargs: [])
    old = copy.copy(driver)
    old.legacy_pit = True
    # Beside the real templates, not under pytest's tmp_path: the VMM runs jailed as its own
    # user and must reach the template's directory the way it reaches theirs.
    root = Path(tempfile.mkdtemp(prefix=".old-machine-test-", dir=runtime.config.home))
    workdir = root / "clone"
    network = runtime.network
    try:
        store = TemplateStore(root, old, runtime.image, network=network,
                              kernel_args=runtime.config.guest_kernel_args(driver.accel))
        tmpl = await store.ensure("base", progress=lambda _: None)
        assert driver.machine() != MACHINE  # the new driver's own machine has no PIT
        assert driver.machine_for(tmpl.snapshot.saved_by) == MACHINE
        workdir.mkdir()
        slot = network.claim(workdir)
        try:
            await asyncio.to_thread(network.setup, slot, NetworkPolicy())
            disk = workdir / "disk.qcow2"
            create_overlay(disk, tmpl.disk, tmpl.disk_bytes)
            vm = await driver.restore(VMPaths(workdir), tmpl.snapshot, disk, netns=slot.netns)
            try:
                assert vm.agent_connection is not None
                agent = await AgentClient.from_socket(vm.agent_connection, timeout=30)
                await agent.ping()  # the restored agent answers
                await agent.close()
            finally:
                vm.kill()
        finally:
            network.teardown(slot)
            network.release(slot)
    finally:
        shutil.rmtree(root, ignore_errors=True)
