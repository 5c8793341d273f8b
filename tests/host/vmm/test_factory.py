"""Drivers by name (PANDASTACK_VMM) and how each one's processes are recognised. No VM."""

from __future__ import annotations

from pathlib import Path

import pytest

from pandastack.host.config import HostConfig
from pandastack.host.vmm import factory
from pandastack.host.vmm.driver import KernelSpec, MachineShape, VMPaths
from pandastack.host.vmm.qemu import QemuDriver
from pandastack.hostport.errors import SetupError
from tests.host import fake_vmm

KERNEL = KernelSpec(Path("/nonexistent/vmlinux"), Path("/nonexistent/initrd"), "console=ttyS0")


def test_the_driver_is_named_by_pandastack_vmm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PANDASTACK_VMM", raising=False)
    assert HostConfig.from_env().vmm == "qemu"
    monkeypatch.setenv("PANDASTACK_VMM", "fake")
    config = HostConfig.from_env(networking=False)
    assert config.vmm == "fake"
    assert isinstance(factory.driver_for(config.vmm, config, KERNEL), fake_vmm.FakeDriver)


def test_an_unknown_driver_names_the_known_ones() -> None:
    with pytest.raises(SetupError) as raised:
        factory.driver_for("firecracker", HostConfig(), KERNEL)
    message = str(raised.value)
    assert "'firecracker'" in message and "PANDASTACK_VMM" in message
    assert "qemu" in message and "fake" in message


def test_qemu_is_set_up_from_the_config() -> None:
    config = HostConfig(accel="tcg", tcg_cpu="max", tb_size_mb=32, stream_huge_pages="auto")
    driver = factory.driver_for("qemu", config, KERNEL, reports_free_pages=True)
    assert isinstance(driver, QemuDriver)
    assert (driver.accel, driver.tb_size_mb, driver.stream_huge_pages) == ("tcg", 32, False)
    plain = factory.driver_for("qemu", config, KERNEL)
    assert isinstance(plain, QemuDriver) and plain.stream_huge_pages is True


def test_qemu_refuses_a_host_without_networking() -> None:
    with pytest.raises(SetupError, match="networking"):
        factory.driver_for("qemu", HostConfig(accel="tcg", networking=False), KERNEL)


def test_qemu_recognises_the_vms_it_starts(tmp_path: Path) -> None:
    driver = QemuDriver("tcg")
    paths = VMPaths(tmp_path / "sbx-000000000001")
    disk = paths.workdir / f"layer-a{driver.disks.suffix}"
    argv = driver._argv(paths, KERNEL, MachineShape(), None, share=False, disk=disk)
    assert driver.processes.is_vmm(argv)
    assert driver.processes.vm_workdir(argv) == paths.workdir
    # Started through nsenter, the process's command line is QEMU's own once it exec'd.
    launched = driver._argv(paths, KERNEL, MachineShape(), None, share=False, disk=disk,
                            netns="pst-1")
    assert launched[0] == "nsenter"
    assert driver.processes.vm_workdir(launched[launched.index("--") + 1:]) == paths.workdir
    # Someone else's QEMU is a VMM, but no VM of ours; a process naming our files is neither.
    other = ["/usr/bin/qemu-system-x86_64", "-m", "512", "-chardev",
             f"socket,id=agent,path={paths.agent_socket},server=on"]
    assert driver.processes.is_vmm(other) and driver.processes.vm_workdir(other) is None
    bystander = ["sleep", "60", f"path={paths.agent_socket}"]
    assert not driver.processes.is_vmm(bystander)
    assert driver.processes.vm_workdir(bystander) is None


def test_garbage_collection_recognises_every_known_drivers_processes(tmp_path: Path) -> None:
    qemu_argv = QemuDriver("tcg")._argv(VMPaths(tmp_path / "a"), KERNEL, MachineShape(), None,
                                        share=False, disk=tmp_path / "a" / "disk")
    fake_argv = ["python3", "-c", "...", fake_vmm.MARK, "--workdir", str(tmp_path / "b")]
    assert factory.is_vmm_process(qemu_argv) and factory.is_vmm_process(fake_argv)
    assert factory.vm_workdir(qemu_argv) == tmp_path / "a"
    assert factory.vm_workdir(fake_argv) == tmp_path / "b"
    assert not factory.is_vmm_process(["sleep", "60"])
