"""The QEMU driver's disks: qcow2 layer chains over the guest image's raw rootfs.

A template's disk is a qcow2 image backed by the raw rootfs (`qemu-img create`, once per
bake). A sandbox's top layer is an empty qcow2 overlay over the layer below it, written
directly (`qcow2.create_overlay`: on the create path a `qemu-img` fork+exec would cost ~10 ms).
A running VM's chain is merged into its top by QEMU itself (`block-stream` over QMP).

A running QEMU opens no disk file by its name: a jailed one (jail.py) sees only an empty
directory. A snapshot's new top reaches it as a descriptor (`switch_top`), and a merge names
its base by node, not by path (`start_flatten`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import subprocess
from pathlib import Path
from typing import Any

from qemu.qmp import QMPClient

from pandastack.host.vmm.driver import VMProcess
from pandastack.host.vmm.qemu.qcow2 import create_overlay
from pandastack.host.vmm.qemu.qmp import QMP_TIMEOUT_S, connect_qmp, qmp_socket, send_fd
from pandastack.hostport.errors import VMMError

QEMU_IMG = "qemu-img"
FLATTEN_JOB = "pandastack-flatten"
ROOT_DRIVE = "root"  # the drive's id on the command line (QemuDriver._argv)


class Qcow2Layers:
    """`DiskLayers` in qcow2."""

    suffix = ".qcow2"

    def create_base(self, path: Path, rootfs: Path) -> None:
        subprocess.run([QEMU_IMG, "create", "-q", "-f", "qcow2", "-F", "raw",
                        "-b", str(rootfs), str(path)], check=True)

    def create_layer(self, path: Path, parent: Path, size_bytes: int) -> None:
        relative = parent.parent.resolve() == path.parent.resolve()
        # A parent in another format is a raw image (a volume under a reader's overlay).
        fmt = "qcow2" if parent.name.endswith(self.suffix) else "raw"
        create_overlay(path, parent, size_bytes, fmt, relative=relative)

    def rebase(self, path: Path, parent: Path) -> None:
        relative = parent.parent.resolve() == path.parent.resolve()
        name = parent.name if relative else str(parent.resolve())
        fmt = "qcow2" if parent.name.endswith(self.suffix) else "raw"
        # -u: the header only (the data stays; the parent's bytes are the same).
        subprocess.run([QEMU_IMG, "rebase", "-q", "-u", "-f", "qcow2", "-F", fmt, "-b", name,
                        str(path)], check=True, capture_output=True)

    def virtual_size(self, path: Path) -> int:
        return int(_info(path)["virtual-size"])

    def layer_chain(self, top: Path) -> list[Path]:
        chain = _info(top, "--backing-chain")
        return [Path(image["filename"]) for image in chain]

    async def start_flatten(self, vm: VMProcess, base: Path) -> None:
        qmp = await connect_qmp(qmp_socket(vm.paths))
        try:
            path = str(base.resolve())
            # "base" by file name would have QEMU resolve the path itself, which a jailed
            # QEMU cannot: find the node holding that file instead.
            node = _node_of(await qmp.execute("query-named-block-nodes"), path)
            if node is None:
                raise VMMError(f"{path} is not in the VM's disk chain")
            # The top's header gets the same absolute backing name a fresh clone's has.
            await qmp.execute("block-stream", {"job-id": FLATTEN_JOB, "device": ROOT_DRIVE,
                                               "base-node": node, "backing-file": path})
        finally:
            await qmp.disconnect()

    async def settle_flatten(self, vm: VMProcess, base: Path, wait_s: float) -> bool:
        qmp = await connect_qmp(qmp_socket(vm.paths))
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + wait_s
            cancelled = False
            while True:
                jobs = await qmp.execute("query-block-jobs")
                if not isinstance(jobs, list) or not any(
                        isinstance(j, dict) and j.get("device") == FLATTEN_JOB for j in jobs):
                    break  # done or cancelled: QEMU drops a job once it has ended
                if not cancelled and loop.time() > deadline:
                    await qmp.execute("block-job-cancel", {"device": FLATTEN_JOB})
                    cancelled = True
                if loop.time() > deadline + QMP_TIMEOUT_S:
                    raise VMMError("the disk merge job did not end after its cancel")
                await asyncio.sleep(0.01)
            return _root_backing(await qmp.execute("query-block")) == str(base.resolve())
        finally:
            await qmp.disconnect()


async def switch_top(qmp: QMPClient, new_top: Path) -> None:
    """Move the root disk onto `new_top` (an empty layer over its current top): the file goes
    to QEMU as a descriptor in an fd set, the layer is added as a node without its backing,
    which `blockdev-snapshot` then makes the current top. Without image locks, as the root
    drive (QemuDriver._argv: a jailed QEMU cannot reopen a layer read-only by name)."""
    fd = os.open(new_top, os.O_RDWR | os.O_CLOEXEC)
    try:
        send_fd(qmp, fd)
        added = await qmp.execute("add-fd", {"opaque": f"top {new_top.name}"})
    finally:
        os.close(fd)
    fdset = int(added["fdset-id"]) if isinstance(added, dict) else 0
    node = "top" + secrets.token_hex(8)
    try:
        # discard=unmap as the drive was opened with (QemuDriver._argv): freed blocks become
        # holes in every layer the guest writes.
        await qmp.execute("blockdev-add", {
            "driver": "qcow2", "node-name": node, "discard": "unmap", "backing": None,
            "file": {"driver": "file", "filename": f"/dev/fdset/{fdset}",
                     "discard": "unmap", "locking": "off"}})
        try:
            await qmp.execute("blockdev-snapshot", {"node": ROOT_DRIVE, "overlay": node})
        except BaseException:
            with contextlib.suppress(Exception):
                await qmp.execute("blockdev-del", {"node-name": node})
            raise
    finally:
        # The node holds its own duplicate: the set itself is no longer needed.
        await qmp.execute("remove-fd", {"fdset-id": fdset})


def _node_of(nodes: object, path: str) -> str | None:
    """The format node (not its protocol node) whose image is the file at `path`."""
    for node in nodes if isinstance(nodes, list) else []:
        if not isinstance(node, dict) or node.get("drv") in ("file", "host_device"):
            continue
        name, file = node.get("node-name"), node.get("file")
        if isinstance(name, str) and isinstance(file, str) and _same_file(file, path):
            return name
    return None


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _info(path: Path, *options: str) -> Any:
    # -U (force share): the image may be open in a running VM.
    out = subprocess.run([QEMU_IMG, "info", "--output=json", "-U", *options, str(path)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def _root_backing(blocks: object) -> str | None:
    """The file name of the root disk's top layer's backing image, from `query-block`."""
    for block in blocks if isinstance(blocks, list) else []:
        if isinstance(block, dict) and block.get("device") == ROOT_DRIVE:
            image = (block.get("inserted") or {}).get("image") or {}
            backing = image.get("backing-image") or {}
            name = backing.get("filename")
            return name if isinstance(name, str) else None
    return None
