"""A runtime starting after a crash in the middle of a hibernation: the VMM still runs under a
record that says `hibernating`. It is killed, and the sandbox is adopted (hibernated when the
file was written whole, else stopped), never removed: a kill first and an ownership check of
the killed process after had sent the whole directory, disk included, to the removal list
(bench/chaos.py: SIGKILL of the server during hibernate lost the persistent sandbox)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from pandastack.host.runtime.records import HIBERNATING, SandboxRecord, sort_state_dir
from pandastack.host.vmm.driver import VMPaths


def _owns_by_cmdline(pid: int, paths: VMPaths) -> bool:
    """As a driver's check does: the live process's command line names the directory."""
    try:
        return str(paths.workdir) in Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return False


def test_the_killed_vmm_of_an_interrupted_hibernation_leaves_its_sandbox(
        tmp_path: Path) -> None:
    workdir = tmp_path / "sbx-00000000000a"
    workdir.mkdir()
    SandboxRecord(id=workdir.name, template="base", template_key="k", template_path="/t",
                  vcpus=1, memory_mb=512, disk_bytes=1, hostname=workdir.name,
                  machine_id="m", created_at=0.0, layers=("layer-0.qcow2",),
                  state=HIBERNATING, pid=4242).save(workdir / "sandbox.json")
    (workdir / "layer-0.qcow2").write_bytes(b"disk")
    (workdir / "hibernate.partial").write_bytes(b"half")  # the save had not finished
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                             str(workdir) + "/"])
    try:
        while not _owns_by_cmdline(proc.pid, VMPaths(workdir)):
            time.sleep(0.01)
        adopt, dead = sort_state_dir(tmp_path, {workdir.name: proc.pid}, (), _owns_by_cmdline)
        assert proc.wait(timeout=10) == -9
        assert dead == [], "the sandbox's directory (its disk) was to be removed"
        assert [(r.id, r.state, vm) for r, vm in adopt] == [(workdir.name, "stopped", None)]
        assert (workdir / "layer-0.qcow2").exists()
    finally:
        proc.kill()
        proc.wait()
