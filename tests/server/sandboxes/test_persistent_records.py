"""How a host's start sorts the directories it finds (host/runtime/records.py, ADR 0037):
what a dead VM leaves is adopted stopped with its disk, a whole hibernation file makes it
hibernated whatever moment of the hibernation a crash hit, and only what is no sandbox's is
removed. Pure file logic; the same with real VMs is in tests/e2e/test_persistent_vm_death.py."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from pandastack.host.runtime.records import (
    HIBERNATING,
    HIBERNATION,
    STOPPED,
    SandboxRecord,
    sort_state_dir,
)
from pandastack.host.vmm.driver import VMPaths


def sandbox(root: Path, n: int, state: str, *files: str) -> Path:
    workdir = root / f"sbx-{n:012x}"
    workdir.mkdir()
    SandboxRecord(id=workdir.name, template="base", template_key="k", template_path="/t",
                  vcpus=1, memory_mb=512, disk_bytes=1, hostname=workdir.name,
                  machine_id="m", created_at=0.0, layers=("layer-0.qcow2",),
                  state=state, pid=4242).save(workdir / "sandbox.json")
    for name in ("layer-0.qcow2", *files):
        (workdir / name).write_bytes(b"x")
    return workdir


def test_dead_vms_leave_stopped_or_hibernated_sandboxes_with_their_files(
        tmp_path: Path) -> None:
    ran = sandbox(tmp_path, 1, "running")
    mid_save = sandbox(tmp_path, 2, HIBERNATING, "hibernate.partial")
    saved = sandbox(tmp_path, 3, HIBERNATING, HIBERNATION)  # the crash: VM ended, no record
    slept = sandbox(tmp_path, 4, "hibernated", HIBERNATION)
    stale = sandbox(tmp_path, 5, "running", HIBERNATION)  # a wake whose VM ran since
    junk = tmp_path / "sbx-0000000000ff"
    junk.mkdir()

    adopt, dead = sort_state_dir(tmp_path, {}, (), lambda pid, paths: True)

    states = {record.id: (record.state, record.pid, vm) for record, vm in adopt}
    assert states == {ran.name: (STOPPED, None, None), mid_save.name: (STOPPED, None, None),
                      saved.name: ("hibernated", None, None),
                      slept.name: ("hibernated", None, None), stale.name: (STOPPED, None, None)}
    assert dead == [junk]
    for workdir in (ran, mid_save, saved, slept, stale):
        assert (workdir / "layer-0.qcow2").exists()  # every disk is kept
    assert (saved / HIBERNATION).exists() and (slept / HIBERNATION).exists()
    assert not (stale / HIBERNATION).exists()  # older than its disk: never restored
    assert not (mid_save / "hibernate.partial").exists()


def test_a_vmm_still_running_under_a_hibernating_record_is_killed(tmp_path: Path) -> None:
    workdir = sandbox(tmp_path, 7, HIBERNATING, HIBERNATION)
    # A process whose command line names the directory, as a VMM's does.
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                             str(workdir) + "/"])
    try:
        # A VMM is only killed when its command line names its directory: wait for the exec.
        while str(workdir) not in Path(f"/proc/{proc.pid}/cmdline").read_text():
            time.sleep(0.01)

        def owns(pid: int, paths: VMPaths) -> bool:
            return pid == proc.pid and paths.workdir == workdir

        adopt, dead = sort_state_dir(tmp_path, {workdir.name: proc.pid}, (), owns)
        assert proc.wait(timeout=10) == -9  # its guest was stopped for the save: ended
        assert [(r.state, vm) for r, vm in adopt] == [("hibernated", None)] and dead == []
    finally:
        proc.kill()
        proc.wait()
