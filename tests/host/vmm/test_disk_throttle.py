"""Each VM's root drive is throttled by its VMM to the configured bytes and operations per
second per vCPU (HostConfig.disk_mbps_per_vcpu, disk_iops_per_vcpu): what QEMU itself
reports for the drive of a running sandbox, and a guest's direct write that cannot outrun
the limit. Real VMs."""

from __future__ import annotations

import time

import pytest

from pandastack.host.runtime import HostRuntime
from pandastack.host.vmm.driver import VMPaths
from pandastack.host.vmm.qemu import DiskLimits, QemuDriver
from pandastack.host.vmm.qemu.disk import ROOT_DRIVE
from pandastack.host.vmm.qemu.qmp import connect_qmp, qmp_socket
from tests.helpers import SandboxFactory

pytestmark = pytest.mark.vm


async def test_the_root_drive_is_throttled_per_vcpu(
        runtime: HostRuntime, sandbox_factory: SandboxFactory) -> None:
    driver = runtime.driver
    assert isinstance(driver, QemuDriver)
    before = driver.disk_limits
    driver.disk_limits = DiskLimits(mbps_per_vcpu=4, iops_per_vcpu=300)  # for this VM
    try:
        sbx = await sandbox_factory()
    finally:
        driver.disk_limits = before
    qmp = await connect_qmp(qmp_socket(VMPaths(sbx.workdir)))
    try:
        blocks = await qmp.execute("query-block")
    finally:
        await qmp.disconnect()
    assert isinstance(blocks, list)
    root = next(b for b in blocks if b.get("device") == ROOT_DRIVE)
    assert (root["inserted"]["bps"], root["inserted"]["iops"]) == (4 << 20, 300), root
    # 16 MiB written past the guest's page cache at 4 MiB/s: about 4 s, however fast the
    # host's disk is (the bound below leaves room for a burst).
    started = time.monotonic()
    r = await sbx.exec(["dd", "if=/dev/zero", "of=/root/t", "bs=1M", "count=16",
                        "oflag=direct"], timeout=120)
    took = time.monotonic() - started
    assert r.exit_code == 0, r.stderr
    assert took > 2.0, f"16 MiB in {took:.1f} s: not throttled to 4 MiB/s"


def test_disk_limits_reach_the_drive_options() -> None:
    assert DiskLimits(256, 4096).drive_options(2) == (
        f",throttling.bps-total={512 << 20},throttling.iops-total=8192")
    assert DiskLimits(0, 0).drive_options(4) == ""
