"""Saving a QEMU VM's state into a file: the descriptor QEMU writes the stream into (no shell,
no pipe), the capabilities each save sets, and the waits around it (qemu.py's snapshot,
hibernation and template saves)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from qemu.qmp import ExecuteError, QMPClient

from pandastack.host.vmm.driver import max_stream_bytes
from pandastack.host.vmm.qemu.qmp import QMP_TIMEOUT_S, send_fd
from pandastack.hostport.errors import VMMError


async def cont_after_migration(qmp: QMPClient, within_s: float = 5.0) -> None:
    """`cont` once a finished migration lets it. QEMU reports a migration "completed" a moment
    before its migration thread leaves the finish-migrate run state, and refuses `cont` until
    then (seen once, in a benchmark's first fork, which failed on it)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            await qmp.execute("cont")
            return
        except ExecuteError as exc:
            if "not finalized" not in str(exc) or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.0005)


STREAM_FD_NAME = "pandastack-migration"


async def pass_stream_fd(qmp: QMPClient, path: Path, *, reserve: int = 0,
                          truncate: bool = True) -> int:
    """Hand QEMU a descriptor of the stream file at `path` for the next `migrate`; return a
    duplicate the caller closes. It shares QEMU's file offset: `stream_written` reads the
    stream's length off it.

    With `reserve`, that much space is allocated first (ENOSPC here, not mid-stream).
    Without `truncate`, an existing file is written over in place (a warm buffer)."""
    # QEMU writes straight into a file descriptor we hand it: no shell, no pipe, no copy.
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_TRUNC if truncate else 0)
    fd = os.open(path, flags, 0o600)
    kept: int | None = None
    try:
        if reserve:
            os.posix_fallocate(fd, 0, reserve)
        kept = os.dup(fd)
        send_fd(qmp, fd)
        await qmp.execute("getfd", {"fdname": STREAM_FD_NAME})
    except BaseException:
        if kept is not None:
            os.close(kept)
        raise
    finally:
        os.close(fd)
    return kept


def stream_bound(summary: object) -> int:
    ram = int(summary.get("base-memory", 0)) if isinstance(summary, dict) else 0
    return max_stream_bytes(ram)


async def start_stream(qmp: QMPClient) -> None:
    """Start writing the stream into the descriptor `pass_stream_fd` handed over."""
    await qmp.execute("migrate", {"uri": f"fd:{STREAM_FD_NAME}"})


def stream_written(kept: int, *, trim: bool) -> int:
    """The stream's length (QEMU's offset in the shared descriptor); with `trim`, a reserved
    file is cut to it. Closes the duplicate."""
    try:
        written = os.lseek(kept, 0, os.SEEK_CUR)
        if trim:
            os.ftruncate(kept, written)
        return written
    finally:
        os.close(kept)


async def prepare_save(qmp: QMPClient, *, background: bool = False) -> bool:
    """Set the capabilities and parameters of the next save; False if QEMU refused a
    background snapshot (its RAM cannot be write-protected), which leaves it a plain one."""
    # Same stream format as template saves (clones' RAM is not shared, so it is all sent);
    # no bandwidth cap (the stream goes to a local file) and a short stop at the end.
    # Capabilities persist in QEMU between migrations: each save sets all it depends on.
    try:
        await qmp.execute("migrate-set-capabilities", {"capabilities": [
            {"capability": "x-ignore-shared", "state": True},
            {"capability": "background-snapshot", "state": background}]})
    except ExecuteError:
        if not background:
            raise
        return False
    await qmp.execute("migrate-set-parameters", {
        "max-bandwidth": 64 << 30, "downtime-limit": 20})
    return True


async def wait_running(qmp: QMPClient, timeout: float = QMP_TIMEOUT_S) -> float:
    """Wait until QEMU resumes the guest after a background snapshot's stop; return the
    monotonic time it was first seen running. A failed migration never resumes it."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        status = await qmp.execute("query-status")
        if isinstance(status, dict) and status.get("running"):
            return time.monotonic()
        migration = await qmp.execute("query-migrate")
        if isinstance(migration, dict) and migration.get("status") in ("failed", "cancelled"):
            raise VMMError(f"migration {migration.get('status')}: "
                           f"{migration.get('error-desc', '')}")
        if asyncio.get_running_loop().time() > deadline:
            raise VMMError(f"the guest did not resume in {timeout}s after its snapshot")
        await asyncio.sleep(0.001)
