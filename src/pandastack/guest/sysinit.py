"""The ``init`` operation: make a freshly restored guest unique (guest mode only)."""

from __future__ import annotations

import fcntl
import os
import socket
import string
import struct
import time

from pandastack.guestproto.ops import ENTROPY_BYTES

# <linux/random.h>
RNDADDENTROPY = 0x40085203  # _IOW('R', 0x03, int[2])
RNDRESEEDCRNG = 0x5207  # _IO('R', 0x07)

_HOSTNAME_CHARS = frozenset(string.ascii_letters + string.digits + "-")
_MACHINE_ID_CHARS = frozenset("0123456789abcdef")


# Plain string checks, not regular expressions: `init` is the first request of every restored
# guest, and under TCG each piece of code it runs first (the regex engine too) is translated.
def _is_dns_label(name: str) -> bool:
    return (0 < len(name) <= 63 and name[0] != "-" and name[-1] != "-"
            and _HOSTNAME_CHARS.issuperset(name))


def _is_machine_id(text: str) -> bool:
    return len(text) == 32 and _MACHINE_ID_CHARS.issuperset(text)


def validate(time_ns: object, hostname: object, machine_id: object, entropy: bytes) -> None:
    """Raise ValueError unless the ``init`` arguments are well formed."""
    if not isinstance(time_ns, int) or isinstance(time_ns, bool) or time_ns <= 0:
        raise ValueError("time_ns must be a positive int")
    if not isinstance(hostname, str) or not _is_dns_label(hostname):
        raise ValueError("hostname must be a valid DNS label")
    if not isinstance(machine_id, str) or not _is_machine_id(machine_id):
        raise ValueError("machine_id must be 32 lowercase hex digits")
    if len(entropy) != ENTROPY_BYTES:
        raise ValueError(f"entropy payload must be {ENTROPY_BYTES} bytes")


def _write_in_place(path: str, text: str) -> None:
    # Every machine-id has the same length, so the file is overwritten, not truncated: a
    # truncation frees the tmpfs page and the write allocates a new one, each a kernel path
    # a clone runs (and, under TCG, translates) for nothing.
    data = text.encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o444)
    try:
        os.pwrite(fd, data, 0)
        if os.fstat(fd).st_size != len(data):
            os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def apply(time_ns: int, hostname: str, machine_id: str, entropy: bytes) -> None:
    """Set the clock, seed the RNG, set hostname and machine-id. Needs root."""
    time.clock_settime_ns(time.CLOCK_REALTIME, time_ns)
    fd = os.open("/dev/random", os.O_WRONLY | os.O_CLOEXEC)
    try:
        info = struct.pack("ii", len(entropy) * 8, len(entropy)) + entropy
        fcntl.ioctl(fd, RNDADDENTROPY, info)
        fcntl.ioctl(fd, RNDRESEEDCRNG)
    finally:
        os.close(fd)
    socket.sethostname(hostname)  # /etc/hostname links to /proc/sys/kernel/hostname
    # /etc/machine-id links to a tmpfs file; the root is mounted noatime and the template's
    # own init leaves the link's dentry cached, so following it costs a clone nothing more.
    _write_in_place("/etc/machine-id", machine_id + "\n")
