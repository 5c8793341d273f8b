"""The guest initramfs: busybox-static, a few kernel modules and the `/init` script.

Written directly as a "newc" cpio archive (gzip-compressed) so that ownership is root, times are
fixed (the output is reproducible) and the `/dev/console` node exists without needing mknod.
"""

from __future__ import annotations

import gzip
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from pandastack.hostport.errors import SetupError

# Inside the initramfs: one module file name per line, in load order.
MODULE_LIST = "etc/pandastack-modules"
MODULE_DIR = "lib/modules"

_TRAILER = "TRAILER!!!"


@dataclass(frozen=True)
class CpioEntry:
    name: str
    mode: int  # full st_mode (type + permissions)
    data: bytes = b""
    rdev: tuple[int, int] = (0, 0)


class CpioWriter:
    """Minimal SVR4 "newc" cpio writer (no hard links), as the kernel's initramfs unpacker reads."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._ino = 1

    def add(self, entry: CpioEntry) -> None:
        name = entry.name.encode() + b"\0"
        fields = (
            self._ino, entry.mode, 0, 0, 1 if not stat.S_ISDIR(entry.mode) else 2, 0,
            len(entry.data), 0, 0, entry.rdev[0], entry.rdev[1], len(name), 0,
        )
        self._ino += 1
        header = b"070701" + b"".join(b"%08X" % f for f in fields)
        self._chunks.append(header + name)
        self._pad()
        self._chunks.append(entry.data)
        self._pad()

    def dir(self, name: str, perm: int = 0o755) -> None:
        self.add(CpioEntry(name, stat.S_IFDIR | perm))

    def file(self, name: str, data: bytes, perm: int = 0o644) -> None:
        self.add(CpioEntry(name, stat.S_IFREG | perm, data))

    def symlink(self, name: str, target: str) -> None:
        self.add(CpioEntry(name, stat.S_IFLNK | 0o777, target.encode()))

    def chardev(self, name: str, major: int, minor: int, perm: int = 0o600) -> None:
        self.add(CpioEntry(name, stat.S_IFCHR | perm, rdev=(major, minor)))

    def getvalue(self) -> bytes:
        trailer = CpioWriter()
        trailer._ino = 0
        trailer.add(CpioEntry(_TRAILER, 0))
        return b"".join(self._chunks) + b"".join(trailer._chunks)

    def _pad(self) -> None:
        size = sum(len(c) for c in self._chunks)
        if size % 4:
            self._chunks.append(b"\0" * (4 - size % 4))


def read_cpio(data: bytes) -> Iterator[CpioEntry]:
    """Entries of a newc cpio archive (the inverse of CpioWriter; used by tests and checks)."""
    pos = 0
    while pos + 110 <= len(data):
        if data[pos : pos + 6] not in (b"070701", b"070702"):
            raise SetupError(f"bad cpio magic at offset {pos}")
        f = [int(data[pos + 6 + 8 * i : pos + 14 + 8 * i], 16) for i in range(13)]
        mode, filesize, rmaj, rmin, namesize = f[1], f[6], f[9], f[10], f[11]
        name_start = pos + 110
        name = data[name_start : name_start + namesize - 1].decode()
        pos = (name_start + namesize + 3) & ~3
        body = data[pos : pos + filesize]
        pos = (pos + filesize + 3) & ~3
        if name == _TRAILER:
            return
        yield CpioEntry(name, mode, body, (rmaj, rmin))


def build_initramfs(
    out: Path, *, busybox: Path, init_script: bytes, modules: Sequence[Path]
) -> None:
    """Write a gzip-compressed initramfs to `out`; `modules` must already be in load order."""
    w = CpioWriter()
    for d in ("bin", "sbin", "dev", "etc", "lib", MODULE_DIR, "newroot", "proc", "sys", "run",
              "tmp"):
        w.dir(d)
    w.chardev("dev/console", 5, 1)
    w.chardev("dev/null", 1, 3, 0o666)
    w.file("bin/busybox", busybox.read_bytes(), 0o755)
    w.symlink("bin/sh", "busybox")
    w.file("init", init_script, 0o755)
    names: list[str] = []
    for ko in modules:
        w.file(f"{MODULE_DIR}/{ko.name}", ko.read_bytes())
        names.append(ko.name)
    w.file(MODULE_LIST, "".join(f"{n}\n" for n in names).encode())
    out.write_bytes(gzip.compress(w.getvalue(), compresslevel=6, mtime=0))


def initramfs_module_order(initrd: Path) -> list[str]:
    """The module load order recorded inside an initramfs built by `build_initramfs`."""
    for entry in read_cpio(gzip.decompress(initrd.read_bytes())):
        if entry.name == MODULE_LIST:
            return entry.data.decode().split()
    raise SetupError(f"{initrd} has no {MODULE_LIST}")
