"""The QEMU machine a VM runs on: which timer devices it has, by accelerator (ADR 0040).
Command lines only, no VM (the whole suite boots on this machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pandastack.host.vmm.driver import KernelSpec, MachineShape, VMPaths
from pandastack.host.vmm.qemu import MACHINE, QemuDriver

KERNEL = KernelSpec(Path("/nonexistent/vmlinux"), Path("/nonexistent/initrd"), "console=ttyS0")


def machine_of(driver: QemuDriver, tmp_path: Path) -> str:
    argv = driver._argv(VMPaths(tmp_path / "sbx-000000000001"), KERNEL, MachineShape(), None,
                        share=False, disk=tmp_path / "disk")
    return argv[argv.index("-M") + 1]


@pytest.mark.parametrize(("accel", "pit"), [("tcg", False), ("kvm", True)])
def test_the_pit_is_left_out_under_tcg_only(accel: str, pit: bool, tmp_path: Path) -> None:
    # Under TCG the firmware leaves the i8254 counting and QEMU's main loop woke for each of
    # its edges in every idle VM; nothing in the guest uses it. KVM keeps its machine.
    options = machine_of(QemuDriver(accel), tmp_path).split(",")
    assert options[0] == "microvm"
    assert ("pit=off" not in options) is pit
    assert QemuDriver(accel).legacy_pit is pit


def test_the_machine_is_part_of_the_templates_key(tmp_path: Path) -> None:
    # A snapshot restores only into the devices it was saved from: templates baked with the
    # PIT must not be restored into machines without it.
    with_pit, without = QemuDriver("tcg", legacy_pit=True), QemuDriver("tcg")
    assert "pit=off" not in machine_of(with_pit, tmp_path).split(",")
    assert with_pit.identity() != without.identity()
    assert without.machine() in without.identity()


def test_a_restore_uses_the_machine_its_template_was_baked_on() -> None:
    # Sandboxes, snapshots and hibernations from before ADR 0040 carry the PIT's state, which
    # does not load into a machine without one: they restore into the machine they left.
    driver = QemuDriver("tcg")
    before = "QEMU emulator version 7.2.22|tcg|max|microvm-v1|volume-slots-4"
    assert driver.machine_for(before) == MACHINE
    with_pit = QemuDriver("tcg", legacy_pit=True)
    assert driver.machine_for(with_pit.identity()) == MACHINE
    assert driver.machine_for(driver.identity()) == f"{MACHINE},pit=off"
    # Nothing recorded (a template.json without "driver"): this driver's own machine.
    assert driver.machine_for("") == driver.machine()


def test_the_restore_command_line_carries_that_machine(tmp_path: Path) -> None:
    argv = QemuDriver("tcg")._argv(VMPaths(tmp_path / "sbx-000000000001"), KERNEL,
                                   MachineShape(), None, share=False, disk=tmp_path / "disk",
                                   machine=MACHINE)
    assert argv[argv.index("-M") + 1] == MACHINE
