"""A fork's snapshot streamed straight from one host to another (ADR 0024), on real VMs and a
real S3 server: two runtimes that share only the object store (the template goes through
it), the snapshot's stream and layers through a one-shot TCP channel between them."""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
from pathlib import Path

import pytest

from pandastack.host.runtime import channel
from pandastack.host.runtime.remote import snapshot_manifest
from pandastack.host.runtime.transfer import EXTENT
from pandastack.hostport.errors import VMMError
from tests.helpers import holder_value, start_holder
from tests.host.runtime.test_runtime_object_store import (
    Host,
    MakeHost,
    _assert_resumed,
    _chain,
    _start_sleeper,
    make_host,
    store_config,
)

__all__ = ["make_host", "store_config"]

pytestmark = pytest.mark.vm





def _stranger(ticket: dict[str, object]) -> bytes:
    """What the destination answers a connection with the wrong token (blocking)."""
    with socket.create_connection((str(ticket["host"]), int(str(ticket["port"]))),
                                  timeout=5) as s:
        s.sendall(secrets.token_bytes(32))
        return s.recv(1)


async def _keys(host: Host) -> set[str]:
    return {key async for key in host.remote.store.list_keys()}


async def _nothing_incoming(host: Host) -> None:
    for _ in range(200):
        if not host.rt.transfers.incoming:
            break
        await asyncio.sleep(0.05)
    assert host.rt.transfers.incoming == {}
    assert list(host.rt.snapshots.root.iterdir()) == []


async def test_a_streamed_snapshot_creates_on_the_other_host_with_nothing_in_the_store(
        make_host: MakeHost) -> None:
    a, b = await make_host(), await make_host()
    parent = await a.rt.create()
    pid = await _start_sleeper(parent)
    holder, value = await start_holder(parent)
    # The template goes through the store by its content key: in it before the count.
    await a.remote.template_part(Path(a.rt.table.record(parent.id).template_path))
    keys = await _keys(a)
    puts = (a.remote.store.stats.uploads, a.remote.store.stats.chunk_uploads)

    offer = await a.rt.transfers.offer(parent.id)
    snap_id = offer["snapshot"]["id"]
    assert a.rt.snapshots.get(snap_id).transient
    ticket = await b.rt.transfers.accept(offer, "127.0.0.1")
    await a.rt.transfers.send(snap_id, ticket)
    got = b.rt.snapshots.get(snap_id)
    assert got.transient and got.layers == a.rt.snapshots.get(snap_id).layers

    child = await b.rt.create(snapshot=snap_id)
    assert await holder_value(child, holder) == value
    await _assert_resumed(child, pid)
    # The chain is the destination's own: the oldest layer rebased onto its template.
    chain = _chain(child.workdir / b.rt.describe(child.id)["layers"][-1])  # type: ignore[index]
    assert all(name.startswith(str(b.root)) for name in chain), chain

    # Nothing of the snapshot went to the store: no object, no manifest, no PUT.
    assert await _keys(a) == keys
    assert (a.remote.store.stats.uploads, a.remote.store.stats.chunk_uploads) == puts
    assert await a.remote.store.get_manifest(snapshot_manifest(snap_id)) is None
    for host in (a, b):
        await asyncio.to_thread(host.rt.delete_snapshot, snap_id)
    assert await holder_value(parent, holder) == value  # the parent runs on


async def test_a_wrong_token_or_a_dead_source_leaves_nothing_on_the_destination(
        make_host: MakeHost) -> None:
    a, b = await make_host(), await make_host()
    parent = await a.rt.create()
    offer = await a.rt.transfers.offer(parent.id)
    snap_id = offer["snapshot"]["id"]

    # Strangers without the token: closed, and after 8 of them the listener is gone.
    ticket = await b.rt.transfers.accept(offer, "127.0.0.1")
    for _ in range(9):
        assert await asyncio.to_thread(_stranger, ticket) == b""  # closed by the destination
    await _nothing_incoming(b)
    with pytest.raises(VMMError):
        await a.rt.transfers.send(snap_id, ticket)

    # A source that dies mid-stream: half a file, then gone.
    ticket = await b.rt.transfers.accept(offer, "127.0.0.1")
    sock = await asyncio.to_thread(channel.connect, ticket["host"], int(ticket["port"]),
                                   bytes.fromhex(ticket["token"]), None)
    size = offer["files"][0]["size"]
    await asyncio.to_thread(sock.sendall, EXTENT.pack(0, size) + b"\x01" * 65536)
    sock.close()
    await _nothing_incoming(b)

    # A source that never comes: the destination stops waiting.
    b.rt.transfers.accept_s = 0.5
    ticket = await b.rt.transfers.accept(offer, "127.0.0.1")
    await _nothing_incoming(b)
    # An extent past a file's declared size is refused, the source told why.
    b.rt.transfers.accept_s = 60.0
    bad = json.loads(json.dumps(offer))
    bad["files"][0]["size"] = 4096
    ticket = await b.rt.transfers.accept(bad, "127.0.0.1")
    with pytest.raises(VMMError):
        await a.rt.transfers.send(snap_id, ticket)
    await _nothing_incoming(b)
    assert b.rt.snapshots.all(include_internal=True) == []
    await asyncio.to_thread(a.rt.delete_snapshot, snap_id)
