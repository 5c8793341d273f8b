"""The byte stream to the host: a virtio-serial port (guest) or an inherited socket (tests)."""

from __future__ import annotations

import logging
import os
import socket
import time

PORT_NAME = "org.pandastack.agent"
READ_SIZE = 256 * 1024
# Reads land in one reused buffer: `os.read(fd, READ_SIZE)` allocates READ_SIZE bytes, above
# malloc's mmap threshold, so every read cost an mmap, an mremap to shrink it and an munmap
# (and page faults): kernel work that, under TCG, a clone also pays to translate.

log = logging.getLogger("pandastack_guest")


class Channel:
    """Blocking byte stream. ``read`` returns b"" when no host is connected."""

    reconnects = False
    """True if a host may connect again after ``read`` returned b"" (virtio-serial)."""

    def read(self) -> bytes:
        raise NotImplementedError

    def write_all(self, data: bytes) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class SocketChannel(Channel):
    """An already-open connected stream socket (``--fd N``). EOF is final."""

    def __init__(self, fd: int) -> None:
        self._sock = socket.socket(fileno=fd)
        self._sock.setblocking(True)
        self._buf = memoryview(bytearray(READ_SIZE))

    def read(self) -> bytes:
        try:
            n = self._sock.recv_into(self._buf)
        except (ConnectionResetError, BrokenPipeError):
            return b""
        return bytes(self._buf[:n])

    def write_all(self, data: bytes) -> None:
        self._sock.sendall(data)

    def close(self) -> None:
        self._sock.close()


class VirtioChannel(Channel):
    """A virtio-serial port char device, opened read+write."""

    reconnects = True

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        self._buf = memoryview(bytearray(READ_SIZE))

    def read(self) -> bytes:
        try:
            n = os.readv(self._fd, [self._buf])
        except OSError as e:
            log.warning("read %s: %s", self.path, e)
            return b""
        return bytes(self._buf[:n])

    def write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    def close(self) -> None:
        os.close(self._fd)


def find_port(name: str = PORT_NAME, sysfs: str = "/sys/class/virtio-ports") -> str | None:
    """Return ``/dev/<vportNpM>`` of the virtio-serial port called ``name``, if any."""
    try:
        entries = sorted(os.listdir(sysfs))
    except OSError:
        return None
    for entry in entries:
        try:
            with open(os.path.join(sysfs, entry, "name")) as f:
                if f.read().strip() == name:
                    return os.path.join("/dev", entry)
        except OSError:
            continue
    return None


def open_port(name: str = PORT_NAME, wait: float = 10.0) -> VirtioChannel:
    """Open the named port, retrying while it (or its /dev node) has not appeared yet."""
    deadline = time.monotonic() + wait
    delay = 0.01
    while True:
        path = find_port(name)
        if path is not None:
            try:
                return VirtioChannel(path)
            except OSError as e:
                if time.monotonic() >= deadline:
                    raise
                log.info("open %s: %s; retrying", path, e)
        elif time.monotonic() >= deadline:
            raise FileNotFoundError(f"no virtio-serial port named {name}")
        time.sleep(delay)
        delay = min(delay * 2, 0.2)
