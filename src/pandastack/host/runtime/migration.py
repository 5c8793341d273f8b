"""Live migration of a running sandbox between two hosts that share an object store
(ADR 0023). The control plane drives both sides; each call is one step:

1. source `offer(sid)`: publishes what the destination lacks and cannot get later (the
   template's files, the frozen layers below the top), as a hibernation would, and says so.
2. destination `accept(sid, offer, listen_host)`: lays the sandbox's directory out (those
   layers fetched, a placeholder top over them), takes a network slot of its own, starts its
   VMM waiting stopped for a stream, and listens on `listen_host` for one connection that
   must open with the ticket's token (channel.py: mutual TLS first where the agents have
   certificates). The ticket: address, port, token, whether TLS.
3. source `send(sid, ticket)`: connects, sends the token and hands the socket to its VMM
   (with TLS, a socket pair whose other end a relay carries over the TLS connection),
   which streams the memory straight to the destination's and stops the guest at the end
   (the switch). Its top layer, flushed now, goes to the store. The handoff names it.
4. destination `complete(sid, handoff)`: the top in place of the placeholder, the guest run
   (its disks are only read from then on), its agent initialised as after a wake: it is an
   ordinary sandbox of this host under the same id. Then source `release(sid)` drops its copy.

Until the destination runs the guest, `abort(sid)` on both sides undoes everything: the
source's guest runs again as if nothing happened, the destination leaves nothing. Every wait
is bounded; an incoming migration that nobody completes or aborts is dropped after ABANDON_S.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import socket
import ssl
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pandastack.host.memory.admission import Reservation
from pandastack.host.network.manager import Slot
from pandastack.host.runtime import channel
from pandastack.host.runtime.records import SANDBOX_ID_RE, SandboxRecord
from pandastack.host.runtime.remote import FORMAT, SANDBOX_FIELDS, RemoteState
from pandastack.host.runtime.sandbox import SandboxHandle
from pandastack.host.vmm.driver import Capability, MachineShape, VMPaths, VMProcess, require
from pandastack.hostport.errors import (
    HostError,
    SandboxNotFound,
    SandboxStateError,
    SetupError,
)
from pandastack.hostport.network import NetworkPolicy

if TYPE_CHECKING:
    from pandastack.host.runtime.parts import RuntimeParts

# How long the destination waits for the source's connection.
ACCEPT_S = 60.0
# Past this the source's guest is stopped so that the rest goes at once; and the bounds of
# the whole stream on either side.
CONVERGE_S = 30.0
STREAM_S = 600.0
ABANDON_S = 900.0


@dataclass
class _Incoming:
    record: SandboxRecord
    workdir: Path
    template: Path
    slot: Slot | None
    vm: VMProcess | None = None
    listener: socket.socket | None = None
    relay: channel.Relay | None = None  # with TLS: the stream's way in to the VMM
    accepting: asyncio.Task[None] | None = None
    expiry: asyncio.Task[None] | None = None
    # The memory its VMM takes while the stream comes in (memory/admission.py): released
    # once the stream is loaded, or when the migration is dropped.
    reservation: Reservation | None = None
    done: bool = False


@dataclass
class _Outgoing:
    layers: tuple[str, ...]
    sent: bool = False  # the VMM stopped the guest: only resume_source runs it again
    stats: dict[str, Any] = field(default_factory=dict)


class Migrations:
    """One runtime's migrations, in and out."""

    def __init__(self, rt: RuntimeParts) -> None:
        self.rt = rt
        self._incoming: dict[str, _Incoming] = {}
        self._outgoing: dict[str, _Outgoing] = {}

    def _tls(self) -> channel.PeerTLS | None:
        return channel.peer_tls(self.rt.config.peer_tls)

    def _remote(self) -> RemoteState:
        if self.rt.remote is None:
            raise SetupError("live migration needs an object store shared by both hosts "
                             "(PANDASTACK_OBJECT_STORE)")
        return self.rt.remote

    # -- source ---------------------------------------------------------------------------

    async def offer(self, sandbox_id: str) -> dict[str, Any]:
        """Publish the template and the frozen layers of the running sandbox; the offer."""
        require(self.rt.driver, Capability.LIVE_MIGRATION, "live migration")
        remote = self._remote()
        handle, vm = self.rt.table.running(sandbox_id, "running")
        if self.rt.table.record(sandbox_id).volumes:
            raise SandboxStateError(f"sandbox {sandbox_id} has volumes mounted: it stays on "
                                    "the host that holds them")
        async with handle.lifecycle_lock:
            await self.rt.settle_flatten(sandbox_id, vm)
            record = self.rt.table.record(sandbox_id)
        frozen = record.layers[:-1]
        # Frozen files: uploaded while the guest runs, outside the lifecycle lock.
        parts = await asyncio.gather(remote.template_part(Path(record.template_path)),
                                     *(remote.put_file(handle.workdir / n, n) for n in frozen))
        self._outgoing[sandbox_id] = _Outgoing(record.layers)
        return {"format": FORMAT, "driver": self.rt.driver.identity(), "id": sandbox_id,
                "record": {n: getattr(record, n) for n in SANDBOX_FIELDS},
                "template": parts[0], "layers": list(parts[1:]), "top": record.top}

    async def send(self, sandbox_id: str, ticket: dict[str, Any]) -> dict[str, Any]:
        """Stream the sandbox to the ticket's destination; on return its guest is stopped
        here for good (unless aborted) and the handoff names its top layer in the store."""
        remote = self._remote()
        out = self._outgoing.get(sandbox_id)
        if out is None or out.sent:
            raise SandboxStateError(f"sandbox {sandbox_id} has no migration offered")
        handle, vm = self.rt.table.running(sandbox_id, "running")
        tls = self._tls()
        host, port, token = channel.checked_ticket(ticket, tls)
        async with handle.lifecycle_lock:
            record = self.rt.table.record(sandbox_id)
            if record.layers != out.layers or self.rt.merges.under_way(sandbox_id):
                raise SandboxStateError(f"sandbox {sandbox_id} changed its disk since the offer")
            sock = await asyncio.to_thread(channel.connect, host, port, token, tls)
            relay = None
            if isinstance(sock, ssl.SSLSocket):
                relay = channel.Relay(sock, outgoing=True, name=f"migration-out-{sandbox_id}")
                relay.start()
            await handle.disconnect()
            handle.state = "migrating"
            try:
                stats = await self.rt.driver.migrate_out(
                    vm, sock.fileno() if relay is None else relay.vmm_end.fileno(),
                    converge_s=CONVERGE_S, timeout=STREAM_S)
                if relay is not None:
                    # The VMM wrote its whole stream: the relay's read ends after the last
                    # byte, whenever the VMM closes its own copy.
                    relay.vmm_end.shutdown(socket.SHUT_WR)
            except BaseException:
                handle.state = "running"
                if relay is not None:
                    relay.stop()
                raise
            finally:
                # The VMM holds its own copy (or none left: its stream ended).
                (sock if relay is None else relay.vmm_end).close()
            try:
                if relay is not None:  # until the stream's last bytes left this host
                    await relay.finish(STREAM_S)
                out.sent = True
                # The guest is stopped and its disks flushed: the top is final.
                top = await remote.put_file(handle.workdir / record.top, record.top)
            except BaseException:
                await self._resume(sandbox_id, handle, vm)
                raise
            out.stats = {"downtime_ms": stats.downtime_ms, "total_ms": stats.total_ms,
                         "bytes": stats.bytes, "method": stats.method}
            return {"top": top, **out.stats}

    async def _resume(self, sandbox_id: str, handle: SandboxHandle, vm: VMProcess) -> None:
        await self.rt.driver.resume_source(vm)
        handle.state = "running"
        self._outgoing.pop(sandbox_id, None)
        await handle.resync_clock(self.rt.table.record(sandbox_id).machine_id)

    async def release(self, sandbox_id: str) -> None:
        """After the destination runs the sandbox: drop this host's copy (its hibernation
        manifest only if it still carries this host's writer token: `kill`)."""
        out = self._outgoing.get(sandbox_id)
        if out is None or not out.sent:
            raise SandboxStateError(f"sandbox {sandbox_id} was not migrated away")
        self._outgoing.pop(sandbox_id, None)
        await self.rt.kill(sandbox_id)

    # -- destination ----------------------------------------------------------------------

    async def accept(self, sandbox_id: str, offer: dict[str, Any],
                     listen_host: str) -> dict[str, Any]:
        require(self.rt.driver, Capability.LIVE_MIGRATION, "live migration")
        remote = self._remote()
        if not SANDBOX_ID_RE.match(sandbox_id) or offer.get("id") != sandbox_id:
            raise ValueError(f"the offer is not one of sandbox {sandbox_id!r}")
        if offer.get("format") != FORMAT or offer.get("driver") != self.rt.driver.identity():
            raise SetupError(f"the offer of {sandbox_id} was made by {offer.get('driver')!r}; "
                             f"this host runs {self.rt.driver.identity()!r}")
        if sandbox_id in self.rt.table or sandbox_id in self._incoming:
            raise SandboxStateError(f"sandbox {sandbox_id} is on this host already")
        fields = dict(offer["record"])
        fields["layers"] = tuple(fields["layers"])
        # The source sends all of the guest's RAM that it touched: counted whole. Refused
        # here, before anything is fetched or laid out, the source's guest runs on.
        reservation = self.rt.admission.vm_start(
            f"incoming migration of {sandbox_id}", self.rt.driver.accel,
            int(fields["memory_mb"]) << 20)
        try:
            policy = await asyncio.to_thread(NetworkPolicy.from_dict, fields["network"])
            template = await remote.fetch_template(offer["template"])
            workdir = self.rt.sandboxes_dir / sandbox_id
            workdir.mkdir(mode=0o700, parents=True, exist_ok=False)
        except BaseException:
            reservation.release()
            raise
        record = SandboxRecord(id=sandbox_id, **fields, template_path=str(template),
                               state="running")
        inc = _Incoming(record, workdir, template, None, reservation=reservation)
        self._incoming[sandbox_id] = inc
        try:
            inc.slot = await self.rt.slots.acquire(workdir, policy)
            inc.record = replace(record, slot=inc.slot.index if inc.slot else None)
            disks = self.rt.driver.disks
            if offer["layers"]:
                await remote.fetch_layers(offer["layers"], workdir, template, writable_top=False)
                parent = workdir / offer["layers"][-1]["name"]
            else:
                parent = template / f"disk{disks.suffix}"
            # Opened (not read) by the VMM now; the source's top takes its place, in the
            # same file, before the VMM reads it (`complete`).
            await asyncio.to_thread(disks.create_layer, workdir / record.top, parent,
                                    record.disk_bytes)
            tmpl = (await self.rt.prepare()).load_dir(record.template, template)
            inc.vm = await self.rt.driver.start_incoming(
                VMPaths(workdir), tmpl.snapshot.kernel,
                MachineShape(record.vcpus, record.memory_mb), workdir / record.top,
                netns=inc.slot.netns if inc.slot is not None else None,
                saved_by=tmpl.snapshot.saved_by)
            token = secrets.token_bytes(channel.TOKEN_BYTES)
            tls = self._tls()
            inc.listener = channel.listen(listen_host)
            port = inc.listener.getsockname()[1]
            loop = asyncio.get_running_loop()
            inc.accepting = loop.create_task(self._accept(inc, token, tls),
                                             name=f"migration-in-{sandbox_id}")
            inc.expiry = loop.create_task(self._expire(sandbox_id),
                                          name=f"migration-expiry-{sandbox_id}")
        except BaseException:
            await self._drop(sandbox_id)
            raise
        self.rt.slots.refill_spares()
        return channel.ticket(listen_host, port, token, tls)

    async def _accept(self, inc: _Incoming, token: bytes, tls: channel.PeerTLS | None) -> None:
        """The one connection that opens with `token` (channel.accept), handed to the VMM."""
        assert inc.listener is not None and inc.vm is not None
        try:
            conn = await channel.accept(inc.listener, token, tls, ACCEPT_S)
        finally:
            inc.listener.close()
        if not isinstance(conn, ssl.SSLSocket):
            # The VMM shares the socket's flags: non-blocking, as asyncio accepted it.
            conn.setblocking(False)
            try:
                await self.rt.driver.accept_incoming(inc.vm, conn.fileno())
            finally:
                conn.close()
            return
        inc.relay = channel.Relay(conn, outgoing=False, name=f"migration-in-{inc.record.id}")
        inc.relay.vmm_end.setblocking(False)  # the same for the pair's end
        try:
            await self.rt.driver.accept_incoming(inc.vm, inc.relay.vmm_end.fileno())
        except BaseException:
            inc.relay.stop()
            raise
        inc.relay.vmm_end.close()
        inc.relay.start()

    async def _expire(self, sandbox_id: str) -> None:
        await asyncio.sleep(ABANDON_S)
        inc = self._incoming.get(sandbox_id)
        if inc is not None and not inc.done:
            self.rt.progress(f"incoming migration of {sandbox_id} abandoned: dropped")
            await self._drop(sandbox_id, expired=True)

    async def complete(self, sandbox_id: str, handoff: dict[str, Any]) -> SandboxHandle:
        """Run the migrated sandbox here (see the module's docstring)."""
        remote = self._remote()
        inc = self._incoming.get(sandbox_id)
        if inc is None or inc.done or inc.vm is None or inc.accepting is None:
            raise SandboxStateError(f"no migration of {sandbox_id} is coming in here")
        vm, record, workdir = inc.vm, inc.record, inc.workdir
        await asyncio.wait_for(asyncio.shield(inc.accepting), ACCEPT_S)
        await self.rt.driver.wait_incoming(vm, STREAM_S)
        # The stream is in the VM's memory now: only its first command's stays reserved.
        first_command = inc.reservation.up(str(workdir)) if inc.reservation else None
        if inc.relay is not None:  # the VMM has the whole stream: the rest is TLS's goodbye
            inc.relay.stop()
        disks = self.rt.driver.disks
        fetched = workdir / f".incoming-top{disks.suffix}"
        await remote.copy_file(handoff["top"], fetched)
        if len(record.layers) == 1:  # the top is the oldest layer: it names a host path
            await asyncio.to_thread(disks.rebase, fetched, inc.template / f"disk{disks.suffix}")
        await asyncio.to_thread(_overwrite, fetched, workdir / record.top)
        inc.done = True
        if inc.expiry is not None:
            inc.expiry.cancel()
        handle = SandboxHandle(  # type: ignore[abstract]  # its listings: see sandbox.py
            sandbox_id, vm, workdir, record.hostname, record.created_at,
            self.rt.config.agent_timeout_s, template=record.template, waker=self.rt.wake,
            forked_from=record.forked_from)
        handle.on_first_command = first_command
        try:
            await self.rt.driver.finish_incoming(vm)
            await handle.initialize(record.machine_id)
            # The last saved state stays in the store; from now on this host writes it.
            writer = ""
            document = await remote.sandbox_document(sandbox_id)
            if document is not None:
                writer = await remote.take_over_sandbox(document)
            record = self.rt.table.save(replace(record, pid=vm.pid, in_store=bool(writer),
                                           store_writer=writer))
        except BaseException:
            await self._drop(sandbox_id)
            raise
        self._incoming.pop(sandbox_id, None)
        self.rt.table.add(handle)
        return handle

    # -- both -----------------------------------------------------------------------------

    async def abort(self, sandbox_id: str) -> None:
        """Undo this host's side of a migration that did not complete: the source's guest
        runs again; the destination's VM, directory and slot go. SandboxNotFound if this
        host has no migration of the sandbox."""
        if sandbox_id in self._incoming:
            await self._drop(sandbox_id)
            return
        out = self._outgoing.pop(sandbox_id, None)
        if out is None:
            raise SandboxNotFound(sandbox_id)
        handle = self.rt.table.find(sandbox_id)
        if out.sent and handle is not None and handle.vm is not None:
            self._outgoing[sandbox_id] = out
            await self._resume(sandbox_id, handle, handle.vm)

    async def _drop(self, sandbox_id: str, *, expired: bool = False) -> None:
        inc = self._incoming.pop(sandbox_id, None)
        if inc is None:
            return
        if inc.reservation is not None:
            inc.reservation.release()
        current = asyncio.current_task()
        for task in (inc.accepting, None if expired else inc.expiry):
            if task is not None and task is not current:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if inc.listener is not None:
            inc.listener.close()
        if inc.relay is not None:
            inc.relay.stop()
        if inc.vm is not None:
            if inc.vm.agent_connection is not None:
                inc.vm.agent_connection.close()
                inc.vm.agent_connection = None
            await asyncio.to_thread(inc.vm.kill)
        self.rt.table.forget(sandbox_id)
        await asyncio.to_thread(shutil.rmtree, inc.workdir, True)
        if inc.slot is not None:
            await self.rt.slots.release(inc.slot)

    async def close(self) -> None:
        """Drop every incoming migration; resume every source that stopped for one."""
        for sid in list(self._incoming):
            await self._drop(sid)
        for sid in list(self._outgoing):
            with contextlib.suppress(HostError):
                await self.abort(sid)


def _overwrite(src: Path, dest: Path) -> None:
    """`src`'s bytes as `dest`'s, in `dest`'s own file: the VMM holds it open."""
    subprocess.run(["cp", "--sparse=always", str(src), str(dest)], check=True)
    src.unlink()

