"""An OCI image booted as a pandastack guest on a real VM: a busybox-only image from the
loopback registry gets our kernel, init and static agent (guest_image.py), boots, and the
agent runs commands in it (its files, busybox's tools where the image has none)."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
import uuid
from pathlib import Path

import pytest

from pandastack.host.agentlink.client import AgentClient
from pandastack.host.images.build import BASE
from pandastack.host.images.oci.guest_image import ensure_oci_image
from pandastack.host.runtime import HostRuntime
from pandastack.host.vmm.driver import KernelSpec, MachineShape, VMPaths
from pandastack.hostport.network import NetworkPolicy
from tests.host.images.oci.conftest import needs_registry
from tests.host.images.oci.helpers import push_image, settings
from tests.host.images.oci.layers import busybox_layer, file, gzipped
from tests.host.images.oci.registry import Registry

pytestmark = [pytest.mark.vm, needs_registry]
BOOT_DEADLINE_S = 240.0


async def connect(paths: VMPaths, alive: object) -> AgentClient:
    deadline = time.monotonic() + BOOT_DEADLINE_S
    while True:
        assert callable(alive) and alive(), paths.console_log.read_text(errors="replace")[-3000:]
        try:
            return await AgentClient.connect(paths.agent_socket, timeout=5)
        except Exception:
            if time.monotonic() > deadline:
                raise


async def test_a_busybox_image_boots_with_our_kernel_init_and_agent(
        runtime: HostRuntime, registry: Registry, tmp_path: Path, skopeo_policy: Path) -> None:
    marker = uuid.uuid4().hex
    push_image(registry, tmp_path, skopeo_policy, "tests/busybox",
               [gzipped(busybox_layer()), gzipped([file("marker", marker + "\n")])])
    await runtime.prepare()
    driver, home = runtime.driver, runtime.config.home
    base = await runtime.machinery.image(BASE)
    lines: list[str] = []
    image = await asyncio.to_thread(
        ensure_oci_image, home, f"{registry.host}/tests/busybox:v1", base=base,
        settings=settings(registry.host), progress=lines.append)
    assert image.rootfs.stat().st_mode & 0o222 == 0
    work = runtime.config.templates_dir / f".tmp-oci-test-{uuid.uuid4().hex[:8]}"
    work.mkdir(parents=True)
    slot = runtime.network.claim(work)
    vm = None
    try:
        await asyncio.to_thread(runtime.network.setup, slot, NetworkPolicy(internet=False))
        disk = work / f"disk{driver.disks.suffix}"
        driver.disks.create_base(disk, image.rootfs)
        paths = VMPaths(work / "vm")
        kernel = KernelSpec(image.kernel, image.initrd,
                            image.cmdline + runtime.config.guest_kernel_args(driver.accel))
        vm = driver.boot(paths, kernel, disk, None, MachineShape(1, 256), netns=slot.netns)
        agent = await connect(paths, vm.is_alive)
        try:
            await agent.init(time_ns=time.time_ns(), entropy=os.urandom(64),
                             hostname="oci", machine_id=uuid.uuid4().hex)
            # uname and id: busybox's, the image's sh (busybox) runs its applets itself.
            result = await agent.exec("cat /marker; uname -r; id -u", timeout=120)
            assert result.exit_code == 0, result.stderr
            out = result.stdout.decode().splitlines()
            assert out == [marker, image.kernel_version, "0"]
            listed = await agent.exec(["/bin/busybox", "ls", "/opt/pandastack"], timeout=60)
            assert listed.stdout.decode().split() == ["bin", "pandastack-agent"]
        finally:
            await agent.close()
    finally:
        if vm is not None:
            vm.kill()
        await asyncio.to_thread(runtime.network.teardown, slot)
        runtime.network.release(slot)
        shutil.rmtree(work, ignore_errors=True)
    again = await asyncio.to_thread(
        ensure_oci_image, home, f"{registry.host}/tests/busybox:v1", base=base,
        settings=settings(registry.host))
    assert again.key == image.key  # cached: the manifest asked for again, nothing rebuilt
    shutil.rmtree(image.rootfs.parent)


async def test_an_images_template_restores_sandboxes_that_see_its_files(
        runtime: HostRuntime, registry: Registry, tmp_path: Path, skopeo_policy: Path) -> None:
    marker = uuid.uuid4().hex
    push_image(registry, tmp_path, skopeo_policy, "tests/busybox-template",
               [gzipped(busybox_layer()), gzipped([file("app/marker", marker + "\n")])])
    store = await runtime.prepare()
    base = await runtime.machinery.image(BASE)
    image = await asyncio.to_thread(
        ensure_oci_image, runtime.config.home, f"{registry.host}/tests/busybox-template:v1",
        base=base, settings=settings(registry.host))
    name = f"oci-test-{marker[:8]}"
    template = await store.ensure_image(name, image, progress=lambda _: None)
    try:
        sandbox = await runtime.create(name)
        try:
            result = await sandbox.exec("cat /app/marker; cat /etc/hostname; ls /opt/pandastack")
            assert result.exit_code == 0, result.stderr
            # The clone's own hostname (its id), set over the template's at the restore.
            assert result.stdout.decode().split() == [marker, sandbox.id, "bin",
                                                      "pandastack-agent"]
        finally:
            await runtime.kill(sandbox.id)
    finally:
        shutil.rmtree(template.path.parent, ignore_errors=True)
        shutil.rmtree(image.rootfs.parent, ignore_errors=True)
