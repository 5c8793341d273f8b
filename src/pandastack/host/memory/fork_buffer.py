"""A warm, memory-backed file that forks write their streams into (ADR 0010).

A fork stops its parent while QEMU writes the guest's whole state into a stream, which the
children then load; the stream is dropped once they run. Written into a new file, most of
that pause is the kernel finding pages for the file, not the copy: for a parent with 200 MB
of written memory (a 294 MiB stream), 119 ms on ext4 and 150 ms on tmpfs, against 54 ms
over tmpfs pages of 2 MiB that were allocated and written before.

So after a fork that had no buffer, one of about its stream's size is prepared in the
background, at idle CPU priority, on a private tmpfs mounted with `huge=always`; the next
fork (of any sandbox) writes there, and gives it back when its children run. A buffer unused
for `keep_s` seconds is released, and with it the memory it holds. One buffer at a time:
a fork that finds it taken, or still being prepared, writes to the snapshot directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from pandastack.host.memory.idle_work import run_at_idle_priority, stop_idle_work

STREAM_NAME = "stream"
CHUNK = 2 << 20  # one huge page


class ForkBuffer:
    def __init__(self, mountpoint: Path, keep_s: float,
                 progress: Callable[[str], None] = print) -> None:
        self.mountpoint = mountpoint
        self.keep_s = keep_s
        self.progress = progress
        self.path = mountpoint / STREAM_NAME
        self.state = "none"  # none -> warming -> idle <-> taken; back to none on release
        self._warming: asyncio.Task[None] | None = None
        self._expiry: asyncio.TimerHandle | None = None
        self._retry_at = 0.0  # after a failed preparation, forks do not retry before this

    @property
    def enabled(self) -> bool:
        return self.keep_s > 0

    def take(self, reserve: int) -> Path | None:
        """The warm buffer, now the caller's until `give_back`, with `reserve` bytes of space
        allocated (a stream never outgrows it mid-save); None if there is none idle or that
        space cannot be had (the buffer is then released)."""
        if self.state != "idle":
            return None
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.posix_fallocate(fd, 0, reserve)
            finally:
                os.close(fd)
        except OSError as exc:
            self.progress(f"fork buffer released: {exc}")
            self._release()
            return None
        self._cancel_expiry()
        self.state = "taken"
        return self.path

    def holds(self, stream: Path) -> bool:
        """True if `stream` (a snapshot's stream link) is this buffer."""
        return stream.is_symlink() and Path(os.readlink(stream)) == self.path

    def give_back(self) -> None:
        if self.state == "taken":
            self.state = "idle"
            self._schedule_expiry()

    def prepare(self, size: int) -> None:
        """Start preparing a buffer with `size` bytes written, unless one exists."""
        loop = asyncio.get_running_loop()
        if not self.enabled or self.state != "none" or loop.time() < self._retry_at:
            return
        self.state = "warming"
        self._warming = loop.create_task(self._warm(size), name="fork-buffer")

    async def _warm(self, size: int) -> None:
        try:
            await asyncio.to_thread(self._mount)
            chunks = -(-size // CHUNK)
            await run_at_idle_priority(
                ["dd", "if=/dev/zero", f"of={self.path}", f"bs={CHUNK}", f"count={chunks}",
                 "conv=notrunc", "status=none"], "writing the buffer")
        except Exception as exc:  # a fork without a buffer still works: say so, go on
            self.progress(f"cannot prepare a fork buffer: {exc}")
            self._retry_at = asyncio.get_running_loop().time() + max(self.keep_s, 60.0)
            await asyncio.to_thread(self._release)
            return
        self.state = "idle"
        self._schedule_expiry()

    def _mount(self) -> None:
        if os.path.ismount(self.mountpoint):
            return
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "huge=always,mode=0700",
                        "pandastack-fork-buffer", str(self.mountpoint)],
                       check=True, capture_output=True)

    def _schedule_expiry(self) -> None:
        self._cancel_expiry()
        self._expiry = asyncio.get_running_loop().call_later(self.keep_s, self._expire)

    def _cancel_expiry(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    def _expire(self) -> None:
        self._expiry = None
        if self.state == "idle":
            self._release()

    def _release(self) -> None:
        """Free the memory and remove the mount. Also what `sweep` does to a buffer a dead
        runtime left."""
        self._cancel_expiry()
        self.state = "none"
        with contextlib.suppress(OSError):
            self.path.unlink()
        if os.path.ismount(self.mountpoint):
            done = subprocess.run(["umount", str(self.mountpoint)], capture_output=True)
            if done.returncode != 0:  # busy: detach it now, the kernel frees it when unused
                subprocess.run(["umount", "--lazy", str(self.mountpoint)], capture_output=True)
        with contextlib.suppress(OSError):
            self.mountpoint.rmdir()

    def sweep(self) -> None:
        """At start: release what a crashed predecessor left."""
        self._release()

    async def close(self) -> None:
        """Stop preparing and release the buffer. A fork that holds it must have ended."""
        await stop_idle_work(self._warming)
        self._warming = None
        await asyncio.to_thread(self._release)
