"""An image's root made bootable as a pandastack guest, without running anything of it: our
static agent, a static busybox under /opt/pandastack/bin (the init's tools where the image
has none: an image need not have a shell, `ip` or `mount`), the init, and the identity files
every clone rewrites. Every write goes through `InsideRoot` (the image's links are followed
inside it, never out), and no chroot: the image's own programs never run on the host."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from pandastack.host.images.oci.inside import InsideRoot
from pandastack.host.images.rootfs import AGENT_BINARY, HOSTNAME, init_for_binary_agent
from pandastack.hostport.errors import SetupError

TOOLS_DIR = "opt/pandastack/bin"
BUSYBOX_IN_ROOT = f"{TOOLS_DIR}/busybox"
_SHEBANG = b"#!/bin/sh\n"
_PATH_LINE = b"export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"


def image_init(rootfs_init: bytes) -> bytes:
    """Our rootfs init for an image: run by busybox's shell, with busybox's applets last on
    PATH (the image's own tools first), starting the static agent."""
    script = init_for_binary_agent(rootfs_init)
    if not script.startswith(_SHEBANG) or script.count(_PATH_LINE) != 1:
        raise SetupError("the rootfs init does not start as the image init expects")
    script = script.replace(_PATH_LINE, _PATH_LINE[:-1] + f":/{TOOLS_DIR}\n".encode())
    return f"#!/{TOOLS_DIR}/sh\n".encode() + script[len(_SHEBANG):]


def busybox_applets(busybox: Path) -> list[str]:
    out = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=True)
    return [name for name in out.stdout.split() if name and "/" not in name]


def make_bootable(root: Path, *, agent_binary: bytes, init_script: bytes,
                  busybox: Path) -> None:
    inside = InsideRoot(root, str(root))
    try:
        root.chmod(0o755)
        inside.make_dir("opt/pandastack")
        inside.make_dir(TOOLS_DIR)
        inside.write_file(BUSYBOX_IN_ROOT, busybox.read_bytes(), 0o755)
        for applet in busybox_applets(busybox):
            if applet != "busybox":
                inside.symlink(f"{TOOLS_DIR}/{applet}", "busybox")
        inside.write_file(AGENT_BINARY, agent_binary, 0o755)
        sbin = inside.entry("sbin")
        if sbin is not None and stat.S_ISLNK(sbin.st_mode):
            # The initramfs looks for /sbin/pandastack-init from outside the image's root:
            # an absolute link (/sbin -> /usr/sbin) would lead it astray, the same link
            # relative (usr/sbin) does not.
            target = os.readlink(root / "sbin")
            if target.startswith("/"):
                inside.symlink("sbin", target.lstrip("/") or ".")
        inside.write_file("sbin/pandastack-init", init_script, 0o755)
        if inside.entry("bin/sh") is None:  # the agent runs commands with /bin/sh -c
            inside.symlink("bin/sh", f"/{BUSYBOX_IN_ROOT}")
        if inside.entry("etc/passwd") is None:
            inside.write_file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
        if inside.entry("etc/group") is None:
            inside.write_file("etc/group", b"root:x:0:\n")
        inside.symlink("etc/hostname", "/proc/sys/kernel/hostname")
        inside.write_file("etc/hosts", f"127.0.0.1\tlocalhost\n127.0.1.1\t{HOSTNAME}\n"
                                       "::1\tlocalhost ip6-localhost ip6-loopback\n".encode())
        inside.write_file("etc/resolv.conf", b"nameserver 169.254.0.22\noptions timeout:2\n")
        inside.symlink("etc/machine-id", "/run/pandastack/machine-id")
        for directory in ("proc", "sys", "dev", "run", "work", "root"):
            if inside.entry(directory) is None:
                inside.make_dir(directory)
        inside.make_dir("tmp", 0o1777)
    finally:
        inside.close()
