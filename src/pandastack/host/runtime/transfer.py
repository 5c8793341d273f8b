"""A fork's snapshot streamed straight from one host to another (ADR 0024): the direct path
of a cross-host fork, with no round trip of the state through the object store.

1. source `offer(sid)`: a transient internal snapshot of the sandbox (as a same-host fork
   takes: its stream may sit in the fork buffer; it is never published), the template's
   files put in the store by content key (as a publish does; after the first time, no
   request: the keys are known), and the offer naming the snapshot, the template part and
   each file the stream carries (the state stream, the frozen layers) with its size.
2. destination `accept(offer, listen_host)`: the template laid out from the store (cached
   after its first use), a work directory for the snapshot, and a one-shot listener on
   `listen_host` for one connection that opens with the ticket's 32-byte token (as a live
   migration's: channel.py, mutual TLS first where the agents have certificates). The
   ticket: address, port, token, whether TLS.
3. source `send(snapshot_id, ticket)`: connects, sends the token, then each file as its
   data extents (holes are not sent), and waits for the destination's answer: it rebased
   the oldest layer onto its own template disk and committed the snapshot as its own
   (transient: a restart sweeps it). Then the control plane creates the children there and
   deletes the snapshot on both hosts.

Everything is bounded: the offer's files (how many, their names, their sizes by the
snapshot's shape), the bytes the destination takes (never past a file's declared size),
one connection, strangers, and every wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import socket
import struct
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pandastack.host.runtime import channel
from pandastack.host.runtime.remote import FORMAT, RemoteState
from pandastack.host.runtime.snapshots import SNAPSHOT_ID_RE, STREAM, allocated_bytes
from pandastack.host.sparse import data_ranges
from pandastack.host.vmm.driver import max_stream_bytes
from pandastack.hostport.errors import (
    SandboxStateError,
    SetupError,
    SnapshotNotFound,
    VMMError,
)
from pandastack.hostport.results import SnapshotInfo

if TYPE_CHECKING:
    from pandastack.host.runtime.parts import RuntimeParts

MiB = 1 << 20
MAX_LAYERS = 64
# A qcow2 layer holds at most the disk's bytes plus its metadata (L1/L2 tables, refcounts).
LAYER_SLACK = 256 * MiB
LAYER_RE = re.compile(r"^layer-[0-9a-f]{12}\.[a-z0-9]{1,8}$")
ACCEPT_S = 60.0  # the destination waits this long for the source's connection
IO_S = 30.0  # a connection that moves no byte for this long is dead
TRANSFER_S = 600.0  # the whole stream, either side
ABANDON_S = 900.0  # a received snapshot nobody deleted goes then
BUFFER = 4 * MiB
# Each extent: offset and length (big-endian u64); length 0 ends the file, its offset is
# then the file's size. After the last file the destination answers OK or FAILED + reason.
EXTENT = struct.Struct("!QQ")
OK, FAILED = b"\x00", b"\x01"
MAX_REASON = 4096


def _bounds(snapshot: dict[str, Any]) -> dict[str, int]:
    """The most bytes each kind of file of a snapshot of this shape may have."""
    return {"stream": max_stream_bytes(int(snapshot["memory_mb"]) * MiB),
            "layer": int(snapshot["disk_bytes"]) + LAYER_SLACK}


def _files(directory: Path, info: SnapshotInfo) -> list[dict[str, Any]]:
    """The files a snapshot's stream carries, in order: the state stream (only what the
    save wrote: in the fork buffer the file is larger), then every layer, oldest first."""
    stream = directory / STREAM
    size = os.stat(stream).st_size  # a symbolic link into the fork buffer: its target's
    if 0 < info.state_bytes <= size:
        size = info.state_bytes
    return [{"name": STREAM, "size": size},
            *({"name": name, "size": os.stat(directory / name).st_size}
              for name in info.layers)]


class Transfers:
    """One runtime's snapshot transfers, out and in."""

    def __init__(self, rt: RuntimeParts) -> None:
        self.rt = rt
        self.accept_s = ACCEPT_S
        self.incoming: dict[str, asyncio.Task[None]] = {}  # snapshot id -> its receiver
        self._expiries: set[asyncio.Task[None]] = set()

    def _tls(self) -> channel.PeerTLS | None:
        return channel.peer_tls(self.rt.config.peer_tls)

    def _remote(self) -> RemoteState:
        if self.rt.remote is None:
            raise SetupError("a snapshot transfer needs an object store shared by both hosts "
                             "(the template goes through it; PANDASTACK_OBJECT_STORE)")
        return self.rt.remote

    # -- source ---------------------------------------------------------------------------

    async def offer(self, sandbox_id: str) -> dict[str, Any]:
        remote = self._remote()
        record = self.rt.table.find_record(sandbox_id)
        if record is not None and record.volumes:
            raise SandboxStateError(f"sandbox {sandbox_id} has volumes mounted: its forks "
                                    "stay on the host that holds them")
        result = await self.rt.snapshot(sandbox_id, internal=True, transient=True)
        info = result.info
        try:
            template = await remote.template_part(Path(info.template_path))
            files = await asyncio.to_thread(_files, self.rt.snapshots.path(info.id), info)
        except BaseException:
            await asyncio.to_thread(self.rt.delete_snapshot, info.id)
            raise
        snapshot = {k: v for k, v in asdict(info).items() if k != "template_path"}
        return {"format": FORMAT, "driver": self.rt.driver.identity(), "snapshot": snapshot,
                "template": template, "files": files, "pause_ms": result.pause_ms,
                "method": result.method}

    async def send(self, snapshot_id: str, ticket: dict[str, Any]) -> None:
        """Stream the snapshot to the ticket's host; returns once that host holds it."""
        info = await asyncio.to_thread(self.rt.snapshots.get, snapshot_id)
        tls = self._tls()
        host, port, token = channel.checked_ticket(ticket, tls)
        directory = self.rt.snapshots.path(snapshot_id)
        files = await asyncio.to_thread(_files, directory, info)
        await asyncio.to_thread(_send, host, port, token, tls, directory, files)

    # -- destination ----------------------------------------------------------------------

    async def accept(self, offer: dict[str, Any], listen_host: str) -> dict[str, Any]:
        remote = self._remote()
        if offer.get("format") != FORMAT or offer.get("driver") != self.rt.driver.identity():
            raise SetupError(f"the snapshot was made by {offer.get('driver')!r}; this host "
                             f"runs {self.rt.driver.identity()!r}")
        snapshot, files = _checked(offer)
        snap_id = str(snapshot["id"])
        if snap_id in self.incoming or self.rt.snapshots.path(snap_id).exists():
            raise SandboxStateError(f"snapshot {snap_id} is on this host already")
        template = await remote.fetch_template(offer["template"])
        try:
            work = self.rt.snapshots.begin(snap_id, hold=True)  # transient: see `sweep`
        except FileExistsError:
            raise SandboxStateError(f"snapshot {snap_id} is coming in already") from None
        listener: socket.socket | None = None
        tls = self._tls()
        try:
            listener = channel.listen(listen_host)
            port = listener.getsockname()[1]
            token = secrets.token_bytes(channel.TOKEN_BYTES)
        except BaseException:
            if listener is not None:
                listener.close()
            self.rt.snapshots.abort(work)
            raise
        self.incoming[snap_id] = asyncio.get_running_loop().create_task(
            self._receive(listener, token, tls, work, snapshot, files, template),
            name=f"snapshot-in-{snap_id}")
        return {**channel.ticket(listen_host, port, token, tls), "snapshot": snap_id}

    async def _receive(self, listener: socket.socket, token: bytes, tls: channel.PeerTLS | None,
                       work: Path, snapshot: dict[str, Any], files: list[dict[str, Any]],
                       template: Path) -> None:
        snap_id = str(snapshot["id"])
        conn: socket.socket | None = None
        committed = False
        try:
            conn = await channel.accept(listener, token, tls, self.accept_s)
            conn.settimeout(IO_S)
            try:
                await asyncio.to_thread(_receive_files, conn, work, files)
                disks = self.rt.driver.disks
                if len(files) > 1:  # the oldest layer names the source's template disk
                    await asyncio.to_thread(disks.rebase, work / files[1]["name"],
                                            template / f"disk{disks.suffix}")
                info = SnapshotInfo(**{**snapshot, "layers": tuple(snapshot["layers"]),
                                       "template_path": str(template), "internal": True,
                                       "transient": True,
                                       "size_bytes": allocated_bytes(work)})
                await asyncio.to_thread(self.rt.snapshots.commit, work, info)
                committed = True
            except BaseException as exc:
                with contextlib.suppress(OSError):
                    conn.sendall(FAILED + str(exc).encode()[:MAX_REASON])
                raise
            with contextlib.suppress(OSError):
                conn.sendall(OK)
            expiry = asyncio.get_running_loop().create_task(self._expire(snap_id))
            self._expiries.add(expiry)
            expiry.add_done_callback(self._expiries.discard)
        except Exception as exc:
            self.rt.progress(f"incoming snapshot {snap_id}: {exc}")
        finally:
            listener.close()
            if conn is not None:
                conn.close()
            if not committed:
                await asyncio.to_thread(self.rt.snapshots.abort, work)
            self.incoming.pop(snap_id, None)

    async def _expire(self, snapshot_id: str) -> None:
        await asyncio.sleep(ABANDON_S)
        with contextlib.suppress(SnapshotNotFound):
            await asyncio.to_thread(self.rt.delete_snapshot, snapshot_id)

    async def close(self) -> None:
        tasks = [*self.incoming.values(), *self._expiries]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _checked(offer: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The offer's snapshot and files, or ValueError: only a snapshot id, the stream and
    the snapshot's own layer names, each no larger than the snapshot's shape allows."""
    snapshot, files = offer.get("snapshot"), offer.get("files")
    if not isinstance(snapshot, dict) or not isinstance(files, list):
        raise ValueError("not a snapshot offer")
    if not SNAPSHOT_ID_RE.match(str(snapshot.get("id", ""))):
        raise ValueError("the offer names no snapshot id")
    layers = snapshot.get("layers")
    if not isinstance(layers, list | tuple) or not 0 < len(layers) <= MAX_LAYERS:
        raise ValueError(f"a snapshot offer has 1 to {MAX_LAYERS} layers")
    names = [STREAM, *layers]
    if [f.get("name") if isinstance(f, dict) else None for f in files] != names or \
            not all(isinstance(n, str) and LAYER_RE.match(n) for n in layers):
        raise ValueError("the offer's files are not the snapshot's stream and layers")
    bounds = _bounds(snapshot)
    for i, f in enumerate(files):
        limit = bounds["stream" if i == 0 else "layer"]
        if not isinstance(f.get("size"), int) or not 0 <= f["size"] <= limit:
            raise ValueError(f"{f['name']} in the offer: size not within 0..{limit}")
    return snapshot, [{"name": f["name"], "size": f["size"]} for f in files]


def _send(host: str, port: int, token: bytes, tls: channel.PeerTLS | None, directory: Path,
          files: list[dict[str, Any]]) -> None:
    deadline = time.monotonic() + TRANSFER_S
    try:
        sock = channel.connect(host, port, token, tls)
    except OSError as exc:
        raise VMMError(f"connecting to {host}:{port} for the snapshot failed: {exc}") from exc
    try:
        sock.settimeout(IO_S)
        for f in files:
            with open(directory / f["name"], "rb") as file:
                for offset, end in data_ranges(file.fileno(), f["size"]):
                    length = end - offset
                    if time.monotonic() > deadline:
                        raise VMMError(f"the snapshot did not go in {TRANSFER_S:.0f}s")
                    sock.sendall(EXTENT.pack(offset, length))
                    # Waiting as the socket's timeout says.
                    if channel.send_file_range(sock, file, offset, length) != length:
                        raise VMMError(f"{f['name']} ended before its size")
                sock.sendall(EXTENT.pack(f["size"], 0))
        sock.settimeout(max(1.0, deadline - time.monotonic()))
        answer = b""
        while len(answer) < 1 + MAX_REASON:
            chunk = sock.recv(1 + MAX_REASON - len(answer))
            if not chunk:
                break
            answer += chunk
            if answer[:1] == OK:
                return
    except (OSError, TimeoutError) as exc:
        raise VMMError(f"streaming the snapshot to {host}:{port} failed: {exc}") from exc
    finally:
        sock.close()
    reason = answer[1:].decode(errors="replace") if answer[:1] == FAILED else "no answer"
    raise VMMError(f"the destination did not take the snapshot: {reason}")


def _recv_into_exactly(conn: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if n == 0:
            raise VMMError("the source went away mid-stream")
        got += n


def _receive_files(conn: socket.socket, work: Path, files: list[dict[str, Any]]) -> None:
    """Each file as the source sends it, never past its declared size (blocking)."""
    deadline = time.monotonic() + TRANSFER_S
    header = bytearray(EXTENT.size)
    buffer = bytearray(BUFFER)
    for f in files:
        size: int = f["size"]
        fd = os.open(work / f["name"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            pos = 0
            while True:
                if time.monotonic() > deadline:
                    raise VMMError(f"the snapshot did not come in {TRANSFER_S:.0f}s")
                _recv_into_exactly(conn, memoryview(header))
                offset, length = EXTENT.unpack(header)
                if length == 0:
                    if offset != size:
                        raise VMMError(f"{f['name']}: {offset} bytes, not {size}")
                    break
                if offset < pos or offset + length > size:
                    raise VMMError(f"{f['name']}: an extent outside the file")
                while length:
                    n = min(length, BUFFER)
                    view = memoryview(buffer)[:n]
                    _recv_into_exactly(conn, view)
                    os.pwrite(fd, view, offset)
                    offset += n
                    length -= n
                pos = offset
            os.ftruncate(fd, size)
        finally:
            os.close(fd)
