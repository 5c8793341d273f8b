"""The jailed VMM (ADR 0036) on real VMs: who QEMU runs as, what it can open, its cgroup."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import time
from pathlib import Path

import pytest
from qemu.qmp import ExecuteError

from pandastack.host.runtime import HostRuntime
from pandastack.host.runtime.sandbox import SandboxHandle
from pandastack.host.vmm import cgroups
from pandastack.host.vmm.driver import MachineShape, VMPaths, pid_is_running
from pandastack.host.vmm.qemu import QemuDriver, jail
from pandastack.host.vmm.qemu.qmp import connect_qmp, qmp_socket
from tests.helpers import SandboxFactory

pytestmark = pytest.mark.vm


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def _uid(runtime: HostRuntime, handle: SandboxHandle) -> int:
    slot = runtime.table.record(handle.id).slot
    assert slot is not None
    return runtime.config.jail_uid_base + slot


async def _refused(handle: SandboxHandle, filename: str) -> str:
    """Ask the running QEMU to open `filename` as a block node; the error it answers."""
    qmp = await connect_qmp(qmp_socket(VMPaths(handle.workdir)))
    try:
        await qmp.execute("blockdev-add", {"driver": "file", "node-name": "probe",
                                           "filename": filename, "read-only": True})
    except ExecuteError as exc:
        return str(exc)
    finally:
        await qmp.disconnect()
    pytest.fail(f"the jailed VMM opened {filename}")


@pytest.fixture
def jailed(runtime: HostRuntime) -> QemuDriver:
    driver = runtime.driver
    assert isinstance(driver, QemuDriver)
    if driver.jail is None:
        pytest.skip("the jail is off (PANDASTACK_JAIL=off)")
    return driver


async def test_the_vmm_is_its_own_uid_seccomp_filtered_chrooted_and_in_its_cgroup(
        runtime: HostRuntime, sandbox_factory: SandboxFactory, jailed: QemuDriver) -> None:
    sbx, neighbour = await sandbox_factory(), await sandbox_factory()
    assert sbx.pid is not None and neighbour.pid is not None
    uid = _uid(runtime, sbx)
    assert uid != _uid(runtime, neighbour)

    status = _status(sbx.pid)
    assert status["Uid"].split() == [str(uid)] * 4 and status["Gid"].split() == [str(uid)] * 4
    assert status["Groups"].split() == [str(uid)]
    assert status["Seccomp"] == "2" and status["NoNewPrivs"] == "1"
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0

    root = sbx.workdir / jail.JAIL_DIR
    assert os.readlink(f"/proc/{sbx.pid}/root") == str(root)
    info = root.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (uid, uid, 0o700)
    assert list(root.iterdir()) == []

    # Nothing outside its empty root: not a root-only host file, not one any user may read,
    # not its own work directory's files, not a neighbour's.
    for path in ("/etc/shadow", "/etc/passwd", str(sbx.workdir / "console.log"),
                 str(neighbour.workdir / "console.log"), str(neighbour.workdir)):
        assert "No such file or directory" in await _refused(sbx, path)
    # ... and the guest still works.
    assert (await sbx.exec(["true"])).exit_code == 0

    name = cgroups.cgroup_name(sbx.workdir)
    membership = cgroups.pid_cgroup(sbx.pid)
    for controller in ("cpu", "cpuacct", "memory", "blkio", "pids"):
        assert f":{controller}:/{cgroups.PARENT}/{name}\n" in membership
    dirs = cgroups.cgroup_dirs(name)
    base = cgroups.CGROUP_ROOT
    limits = jail.limits_for(MachineShape(1, 512), jailed.jail or jail.JailSettings())
    assert (base / "cpu" / cgroups.PARENT / name / "cpu.cfs_quota_us").read_text().strip() \
        == str(cgroups.CFS_PERIOD_US)
    assert int((base / "memory" / cgroups.PARENT / name / "memory.limit_in_bytes")
               .read_text()) == limits.memory_bytes
    assert (base / "pids" / cgroups.PARENT / name / "pids.max").read_text().strip() \
        == str(limits.pids)

    await runtime.kill(sbx.id)
    assert not pid_is_running(sbx.pid)
    assert [d for d in dirs if d.exists()] == [] and not sbx.workdir.exists()


async def test_a_one_vcpu_vmm_takes_at_most_one_core(
        runtime: HostRuntime, sandbox_factory: SandboxFactory, jailed: QemuDriver) -> None:
    """Two busy loops in a 1-vCPU guest, and a host whose VMM threads (vCPU, main loop, I/O)
    could together take more than its one core: the cgroup's CPU time over a window stays
    within about one core (a bound, not a timing)."""
    sbx = await sandbox_factory()
    name = cgroups.cgroup_name(sbx.workdir)
    burn = asyncio.ensure_future(sbx.exec(
        ["sh", "-c", "for i in 1 2; do timeout 12 sh -c 'while :; do :; done' & done; wait"],
        timeout=60))
    try:
        await asyncio.sleep(3)  # both loops running
        used0, t0 = cgroups.cpu_usage_ns(name), time.monotonic_ns()
        await asyncio.sleep(5)
        used1, t1 = cgroups.cpu_usage_ns(name), time.monotonic_ns()
        assert (used1 - used0) / (t1 - t0) < 1.2
    finally:
        await burn


async def test_a_crashed_vmms_cgroup_is_reaped(
        runtime: HostRuntime, sandbox_factory: SandboxFactory, jailed: QemuDriver) -> None:
    """A VMM that died with nobody to remove its cgroup (its runtime crashed too): the host's
    gc removes the empty cgroup once it is older than a VMM's start."""
    sbx = await sandbox_factory()
    assert sbx.pid is not None
    name = cgroups.cgroup_name(sbx.workdir)
    dirs = cgroups.cgroup_dirs(name)
    os.kill(sbx.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(cgroups.procs(d) for d in dirs) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert all(d.exists() for d in dirs)
    assert name not in cgroups.stale()  # too young: it may be a VMM's that is starting
    past = time.time() - 300
    for d in dirs:
        os.utime(d, (past, past))
    assert name in cgroups.stale()
    assert name in cgroups.remove_stale(lambda _m: None)
    assert [d for d in dirs if d.exists()] == []
    assert not Path(f"/proc/{sbx.pid}").exists() or not pid_is_running(sbx.pid)
