"""The ``init`` operation: make a freshly restored guest unique (guest mode only)."""

from __future__ import annotations

import fcntl
import os
import re
import socket
import struct
import time

# <linux/random.h>
RNDADDENTROPY = 0x40085203  # _IOW('R', 0x03, int[2])
RNDRESEEDCRNG = 0x5207  # _IO('R', 0x07)
ENTROPY_BYTES = 64

_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
_MACHINE_ID = re.compile(r"^[0-9a-f]{32}$")


def validate(time_ns: object, hostname: object, machine_id: object, entropy: bytes) -> None:
    """Raise ValueError unless the ``init`` arguments are well formed."""
    if not isinstance(time_ns, int) or isinstance(time_ns, bool) or time_ns <= 0:
        raise ValueError("time_ns must be a positive int")
    if not isinstance(hostname, str) or not _HOSTNAME.match(hostname):
        raise ValueError("hostname must be a valid DNS label")
    if not isinstance(machine_id, str) or not _MACHINE_ID.match(machine_id):
        raise ValueError("machine_id must be 32 lowercase hex digits")
    if len(entropy) != ENTROPY_BYTES:
        raise ValueError(f"entropy payload must be {ENTROPY_BYTES} bytes")


def _write_file(path: str, text: str) -> None:
    path = os.path.realpath(path)  # the image links these to a tmpfs; keep the link
    tmp = f"{path}.pandastack-tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o444 if path.endswith("machine-id") else 0o644)
    os.replace(tmp, path)


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
    socket.sethostname(hostname)
    _write_file("/etc/hostname", hostname + "\n")
    _write_file("/etc/machine-id", machine_id + "\n")
