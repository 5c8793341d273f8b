"""The QEMU driver's disks: qcow2 layers that `qemu-img` accepts, chains that open through
links in any directory, and the end of a merge. No VM needed (QMP is faked)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pandastack.host.vmm.driver import VMPaths, VMProcess
from pandastack.host.vmm.qemu import QemuDriver
from pandastack.host.vmm.qemu import disk as qemu_disk
from pandastack.host.vmm.qemu.disk import Qcow2Layers

MIB = 1 << 20


def _check(image: Path) -> None:
    subprocess.run(["qemu-img", "check", "-q", str(image)], check=True)


def test_layers_make_a_chain_that_opens_through_links_elsewhere(tmp_path: Path) -> None:
    disks = QemuDriver("tcg").disks
    rootfs = tmp_path / "rootfs.img"
    with open(rootfs, "wb") as f:
        f.truncate(64 * MIB)
    template, first, second = tmp_path / "templates", tmp_path / "sbx-1", tmp_path / "sbx-2"
    for directory in (template, first, second):
        directory.mkdir()
    base = template / f"disk{disks.suffix}"
    disks.create_base(base, rootfs)
    assert disks.virtual_size(base) == 64 * MIB
    # A sandbox's first layer names the template's disk absolutely, the next its parent by
    # file name: links to both in another directory open the same chain there.
    lower, top = first / f"layer-a{disks.suffix}", first / f"layer-b{disks.suffix}"
    disks.create_layer(lower, base, 128 * MIB)
    disks.create_layer(top, lower, 128 * MIB)
    for layer in (lower, top):
        _check(layer)
        os.link(layer, second / layer.name)
    assert disks.virtual_size(top) == 128 * MIB
    assert disks.layer_chain(second / top.name) == [
        second / top.name, second / lower.name, base, rootfs]
    assert disks.layer_chain(lower) == [lower, base, rootfs]
    with pytest.raises(FileExistsError):  # a layer is never written over
        disks.create_layer(top, lower, 128 * MIB)


class FlattenQMP:
    """A merge job that never ends by itself: only a cancel ends it."""

    def __init__(self, backing: str) -> None:
        self.backing = backing
        self.job = True
        self.sent: list[str] = []

    async def execute(self, cmd: str, args: dict[str, Any] | None = None) -> object:
        self.sent.append(cmd)
        if cmd == "query-block-jobs":
            return [{"device": qemu_disk.FLATTEN_JOB, "status": "running"}] if self.job else []
        if cmd == "block-job-cancel":
            self.job = False
        if cmd == "query-block":
            return [{"device": "other"}, {"device": "root", "inserted": {"image": {
                "filename": "/x/top.qcow2", "backing-image": {"filename": self.backing}}}}]
        return {}

    async def disconnect(self) -> None:
        pass


@pytest.mark.parametrize(("backing", "merged"), [("base", True), ("/x/middle.qcow2", False)])
async def test_settle_flatten_cancels_a_slow_merge_and_reads_the_chain(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, backing: str, merged: bool) -> None:
    base = tmp_path / "base.qcow2"
    fake = FlattenQMP(str(base) if backing == "base" else backing)

    async def connect(path: Path, timeout: float = 0) -> FlattenQMP:
        return fake

    monkeypatch.setattr(qemu_disk, "connect_qmp", connect)
    vm = VMProcess(0, VMPaths(tmp_path))
    done = await Qcow2Layers().settle_flatten(vm, base, wait_s=0.05)
    assert done is merged
    assert fake.sent.count("block-job-cancel") == 1 and fake.sent[-1] == "query-block"
