"""Live migration between two QEMUs (ADR 0023): the destination waits stopped for a stream
on a socket the host agent accepted and checked, the source sends its RAM and device state
into a socket the agent connected; QEMU stops the source at completion.

Neither QEMU touches the network itself: each runs inside its sandbox's network namespace,
which reaches neither the other host nor the agents' addresses. The agents hold the TCP
connection and hand its descriptor to QEMU (`getfd`, then `fd:` URIs).

The destination's disks stay inactive until `cont` (capability `late-block-activate`), so
the host can put the source's top layer in place after the source flushed it and before the
destination reads it: an inactive qcow2 re-reads its metadata when it is activated.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from qemu.qmp import QMPClient

from pandastack.host.vmm.driver import MigrationStats, VMProcess
from pandastack.host.vmm.qemu.qmp import connect_qmp, qmp_socket, send_fd, wait_migration
from pandastack.hostport.errors import VMMError

SOCKET_FD_NAME = "pandastack-migration-socket"
# The stop at the end of a pre-copy: QEMU stops the source once it can send the rest within
# this; past `converge_s` the guest is stopped so that the rest goes at once (bounded time).
DOWNTIME_LIMIT_MS = 300
# The memory stream shares the host's network with everything else: bounded, but well above
# what a 10 GbE link carries, so that it never is the limit on one machine.
MAX_BANDWIDTH = 4 << 30


async def _hand_socket(qmp: QMPClient, sock_fd: int) -> None:
    send_fd(qmp, sock_fd)
    await qmp.execute("getfd", {"fdname": SOCKET_FD_NAME})


async def _capabilities(qmp: QMPClient, **caps: bool) -> None:
    await qmp.execute("migrate-set-capabilities", {"capabilities": [
        {"capability": name.replace("_", "-"), "state": on} for name, on in caps.items()]})


async def incoming(vm: VMProcess, sock_fd: int) -> None:
    """Destination: load the stream arriving on `sock_fd` (a connected socket, a duplicate
    is handed over: the caller closes its own). The VM stays stopped, its disks inactive."""
    qmp = await connect_qmp(qmp_socket(vm.paths))
    try:
        # Same stream format as every restore here (x-ignore-shared, ADR 0002).
        await _capabilities(qmp, x_ignore_shared=True, late_block_activate=True)
        await _hand_socket(qmp, sock_fd)
        await qmp.execute("migrate-incoming", {"uri": f"fd:{SOCKET_FD_NAME}"})
    finally:
        await qmp.disconnect()


async def wait_incoming(vm: VMProcess, timeout: float) -> None:
    """Destination: until the whole stream is loaded. A QEMU whose load failed exits."""
    qmp = await connect_qmp(qmp_socket(vm.paths))
    try:
        await wait_migration(qmp, timeout, what="incoming migration")
    finally:
        await qmp.disconnect()


async def outgoing(vm: VMProcess, sock_fd: int, *, live: bool, converge_s: float,
                   timeout: float) -> MigrationStats:
    """Source: send the running VM into `sock_fd`; on return the guest is stopped for good
    (unless `resume_source`), its disks flushed and inactive. Without `live` (a VMM whose
    dirty tracking loses writes) the guest is stopped first, and the stream is one instant."""
    qmp = await connect_qmp(qmp_socket(vm.paths))
    started = time.monotonic()
    stopped_at: float | None = None
    try:
        await _capabilities(qmp, x_ignore_shared=True, background_snapshot=False)
        await qmp.execute("migrate-set-parameters", {
            "max-bandwidth": MAX_BANDWIDTH, "downtime-limit": DOWNTIME_LIMIT_MS})
        await _hand_socket(qmp, sock_fd)
        if not live:
            stopped_at = time.monotonic()
            await qmp.execute("stop")
        await qmp.execute("migrate", {"uri": f"fd:{SOCKET_FD_NAME}"})

        async def converge(_elapsed: float) -> None:
            nonlocal stopped_at
            now = time.monotonic()
            if stopped_at is None and now - started > converge_s:
                # The guest dirties memory faster than it goes: stop it, send the rest.
                stopped_at = now
                await qmp.execute("stop")

        info = await wait_migration(qmp, timeout - (time.monotonic() - started),
                                    on_poll=converge)
        total_ms = (time.monotonic() - started) * 1000
        ram: dict[str, Any] = info.get("ram") or {}
        sent = int(ram.get("transferred", 0))
        if stopped_at is not None:
            return MigrationStats((time.monotonic() - stopped_at) * 1000, total_ms, sent,
                                 "stopped")
        return MigrationStats(float(info.get("downtime", 0)), total_ms, sent, "precopy")
    except BaseException:
        with contextlib.suppress(Exception):
            await qmp.execute("migrate_cancel")
        with contextlib.suppress(Exception):
            await _resume(qmp)
        raise
    finally:
        await qmp.disconnect()


async def _migration_ended(qmp: QMPClient, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while True:
        info = await qmp.execute("query-migrate")
        status = info.get("status") if isinstance(info, dict) else None
        if status not in ("active", "setup", "cancelling", "device", "pre-switchover"):
            return
        if time.monotonic() > deadline:
            raise VMMError(f"the migration did not end in {within_s}s ({status})")
        await asyncio.sleep(0.005)


async def _resume(qmp: QMPClient, within_s: float = 10.0) -> None:
    """`cont` the source again: once its migration has ended (cancelled or failed) and as
    long as the guest is not running. `cont` activates its disks again."""
    await _migration_ended(qmp, within_s)
    state = await qmp.execute("query-status")
    if isinstance(state, dict) and not state.get("running"):
        await qmp.execute("cont")


async def settle(vm: VMProcess, running: bool) -> None:
    """A VM whose controlling process died in the middle of something (a save, a fork's or a
    snapshot's stream, a migration out, a wake's restore): an outgoing migration is
    cancelled, and the vCPUs run (`running`) or stay stopped. VMMError for one still loading
    an incoming stream (its guest never ran from it: end it instead)."""
    qmp = await connect_qmp(qmp_socket(vm.paths))
    try:
        status = await qmp.execute("query-status")
        if isinstance(status, dict) and status.get("status") == "inmigrate":
            raise VMMError("it is still loading the state it was restored from")
        with contextlib.suppress(Exception):
            await qmp.execute("migrate_cancel")
        if running:
            await _resume(qmp)
            return
        await _migration_ended(qmp, 10.0)
        state = await qmp.execute("query-status")
        if isinstance(state, dict) and state.get("running"):
            await qmp.execute("stop")
    finally:
        await qmp.disconnect()


async def resume_source(vm: VMProcess) -> None:
    """Source, before the destination ran: back to running as if nothing happened."""
    qmp = await connect_qmp(qmp_socket(vm.paths))
    try:
        with contextlib.suppress(Exception):
            await qmp.execute("migrate_cancel")
        await _resume(qmp)
    finally:
        await qmp.disconnect()
