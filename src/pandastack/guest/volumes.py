"""`mount_volume` / `unmount_volume`: a durable volume the host attached to a slot.

Templates are baked with empty virtio-blk slots (QEMU's microvm machine has no hot-plug);
at restore the host backs a slot with the volume's image and tells the guest kernel its new
capacity. The guest finds the slot by its virtio serial, waits for that capacity (the host's
config-change interrupt may still be on its way), and mounts it with mount(2) directly: a
`mount` process would cost tens of milliseconds of every create under TCG."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import time

from pandastack.guestproto.frames import Frame

from .ops import Handler, Op, OpError, arg_bool, arg_int, arg_str

SYS_BLOCK = "/sys/block"
CAPACITY_WAIT_S = 5.0
MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4
FIFREEZE = 0xC0045877  # linux/fs.h: _IOWR('X', 119, int)
# Mount points a volume may not cover: the agent's own and the kernel's file systems.
FORBIDDEN = ("/", "/proc", "/sys", "/dev", "/run", "/opt/pandastack", "/tmp")

_libc = ctypes.CDLL(None, use_errno=True)


# serial -> disk name, learnt at the template's boot (`learn_disks`): a restore keeps the
# device set, so the names hold in every clone.
_disks: dict[str, str] = {}


def learn_disks(sys_block: str = SYS_BLOCK) -> dict[str, str]:
    found: dict[str, str] = {}
    try:
        names = sorted(os.listdir(sys_block))
    except OSError:
        return found
    for name in names:
        try:
            with open(os.path.join(sys_block, name, "serial"), encoding="ascii") as f:
                found[f.read().strip()] = name
        except OSError:
            continue
    _disks.clear()
    _disks.update(found)
    return found


def device_of(serial: str, sys_block: str = SYS_BLOCK) -> tuple[str, str]:
    """(/dev/vdX, its /sys/block directory) of the disk whose virtio serial is `serial`."""
    name = _disks.get(serial)
    if name is None or not os.path.isdir(os.path.join(sys_block, name)):
        name = learn_disks(sys_block).get(serial)
    if name is None:
        raise OpError("ENODEV", f"no disk with serial {serial!r} (is the template baked "
                      "with volume slots?)")
    return f"/dev/{name}", os.path.join(sys_block, name)


def wait_capacity(sys_dir: str, size_bytes: int, timeout: float = CAPACITY_WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with open(os.path.join(sys_dir, "size"), encoding="ascii") as f:
            seen = int(f.read().strip()) * 512
        if seen == size_bytes:
            return
        if time.monotonic() > deadline:
            raise OpError("ETIMEDOUT", f"{sys_dir}: the disk shows {seen} bytes, "
                          f"not {size_bytes}")
        time.sleep(0.002)


def check_mount_path(path: str) -> str:
    norm = os.path.normpath(path)
    if not os.path.isabs(norm):
        raise OpError("EINVAL", "mount path must be absolute", path)
    for bad in FORBIDDEN:
        if norm == bad or (bad != "/" and norm.startswith(bad + "/")):
            raise OpError("EINVAL", f"a volume cannot be mounted on or under {bad}", path)
    return norm


def _mount(device: str, path: str, read_only: bool) -> None:
    flags = MS_NOSUID | MS_NODEV | (MS_RDONLY if read_only else 0)
    # A read-only mount still replays a journal a killed writer left: the host backs a
    # reader's disk with an overlay of its own, so the replay writes only there.
    # `discard`: what a file system frees goes back to the host as holes in the image.
    data = None if read_only else b"discard"
    if _libc.mount(device.encode(), path.encode(), b"ext4", flags, data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)


def mount_volume(op: Op, f: Frame) -> None:
    serial = arg_str(f.header, "serial")
    path = check_mount_path(arg_str(f.header, "path"))
    read_only = arg_bool(f.header, "read_only")
    size_bytes = arg_int(f.header, "size_bytes", lo=1)
    device, sys_dir = device_of(serial)
    wait_capacity(sys_dir, size_bytes)
    os.makedirs(path, exist_ok=True)
    _mount(device, path, read_only)
    op.send("ok", device=device)


def freeze_volume(op: Op, f: Frame) -> None:
    """Flush the file system at `path` and leave it frozen, clean on disk (the journal
    empty): what the host asks before it kills the VM, so the next mount has nothing to
    replay. Any writer blocks from then on; the VM is not meant to run much longer."""
    path = check_mount_path(arg_str(f.header, "path"))
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, FIFREEZE, 0)
    except OSError as e:
        if e.errno != errno.EBUSY:  # EBUSY: frozen already
            raise
    finally:
        os.close(fd)
    op.send("ok")


def unmount_volume(op: Op, f: Frame) -> None:
    path = check_mount_path(arg_str(f.header, "path"))
    os.sync()
    if _libc.umount2(path.encode(), 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    op.send("ok")


#: The requests this module answers (the agent's dispatch table is made of these).
HANDLERS: dict[str, Handler] = {
    "mount_volume": lambda a, op, f: mount_volume(op, f),
    "unmount_volume": lambda a, op, f: unmount_volume(op, f),
    "freeze_volume": lambda a, op, f: freeze_volume(op, f),
}
