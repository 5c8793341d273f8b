"""VM cgroups' files on a cgroup v2 layout, which this host does not mount (v1 is tested on
real VMs in test_jail.py): a directory tree shaped as the kernel's, pure logic."""

from __future__ import annotations

import os
import time
from pathlib import Path

from pandastack.host.vmm import cgroups
from pandastack.host.vmm.driver import MachineShape
from pandastack.host.vmm.qemu import jail


def _v2_tree(root: Path) -> Path:
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma\n")
    (root / "cgroup.subtree_control").write_text("")
    parent = root / cgroups.PARENT
    parent.mkdir()
    (parent / "cgroup.controllers").write_text("cpu io memory pids\n")
    (parent / "cgroup.subtree_control").write_text("")
    return parent


def test_v2_limits_match_the_machine(tmp_path: Path) -> None:
    parent = _v2_tree(tmp_path)
    name = cgroups.cgroup_name(Path("/var/lib/pandastack/sandboxes/sbx-1"))
    cg = parent / name
    cg.mkdir()
    (cg / "io.weight").write_text("default 100\n")  # present where the scheduler has one
    limits = jail.limits_for(MachineShape(vcpus=2, memory_mb=1024), jail.JailSettings())
    assert cgroups.is_v2(tmp_path)
    assert cgroups.create(name, limits, tmp_path) == [cg]
    assert (cg / "cpu.max").read_text() == f"{2 * cgroups.CFS_PERIOD_US} {cgroups.CFS_PERIOD_US}"
    assert (cg / "memory.max").read_text() == str((2 * 1024 + 64 + jail.OVERHEAD_MB) << 20)
    assert (cg / "pids.max").read_text() == str(jail.PIDS_MAX)
    assert (cg / "io.weight").read_text() == "default 100"
    assert (parent / "cgroup.subtree_control").read_text().startswith("+")
    assert cgroups.cgroup_dirs(name, tmp_path) == [cg]

    (cg / "cpu.stat").write_text("usage_usec 2500\nuser_usec 2000\n")
    assert cgroups.cpu_usage_ns(name, tmp_path) == 2_500_000


def test_only_empty_old_cgroups_are_stale(tmp_path: Path) -> None:
    parent = _v2_tree(tmp_path)
    past = time.time() - 300
    for name, procs, old in (("empty-old", "", True), ("busy-old", "4242\n", True),
                             ("empty-young", "", False)):
        cg = parent / name
        cg.mkdir()
        (cg / "cgroup.procs").write_text(procs)
        if old:
            os.utime(cg, (past, past))
    assert cgroups.stale(tmp_path) == ["empty-old"]


def test_names_differ_per_work_directory() -> None:
    a = cgroups.cgroup_name(Path("/t/one.tmp-1/vm"))
    b = cgroups.cgroup_name(Path("/t/two.tmp-1/vm"))
    assert a != b and a.startswith("vm-") and b.startswith("vm-")


def test_uids_follow_the_network_slot() -> None:
    assert jail.uid_for("psn-17", 200_000) == 200_017
    assert jail.uid_for(None, 200_000) == 200_000 + jail.UNSLOTTED
