"""Ports for servers a test starts as child processes.

A port found by binding port 0 and closing the socket comes from the kernel's ephemeral range
(`net.ipv4.ip_local_port_range`, 32768-60999 here), the same range every outgoing connection
takes its local port from; in the second or two before the child binds it, any connection on
the machine (another xdist worker's, another session's) may take it, and the child's bind then
fails with EADDRINUSE. Ports below that range are never handed out implicitly, so only an
explicit bind can take one. Each xdist worker draws from its own slice of PORT_RANGE (no two
workers of a run pick the same port), never hands out a port twice in a process, and checks
that nothing holds the port now.
"""

from __future__ import annotations

import os
import random
import re
import socket

#: Below Linux's default ephemeral range (32768-60999), above the well-known services'.
PORT_RANGE = (20000, 32000)
#: Enough slices for the workers of any run here (`-n` is at most a few on 2 cores).
SLICES = 8

_handed: set[int] = set()


def _slice() -> range:
    match = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))
    index = int(match.group(1)) % SLICES if match else SLICES - 1
    size = (PORT_RANGE[1] - PORT_RANGE[0]) // SLICES
    start = PORT_RANGE[0] + index * size
    return range(start, start + size)


def _free_now(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port on 127.0.0.1 nothing holds now, from this worker's slice, not handed out before
    in this process."""
    ports = _slice()
    start = random.randrange(len(ports))
    for i in range(len(ports)):
        port = ports[(start + i) % len(ports)]
        if port not in _handed and _free_now(port):
            _handed.add(port)
            return port
    raise RuntimeError(f"no free port left in {ports.start}-{ports.stop - 1}")
