"""Live migration between two runtimes on this machine that share a real S3 store (ADR 0023),
on real VMs: the memory goes from one QEMU to the other over loopback TCP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from pandastack.host.config import HostConfig
from pandastack.host.objects import ObjectStoreConfig
from pandastack.host.runtime.sandbox import SandboxHandle
from pandastack.host.vmm.qemu import qmp
from pandastack.hostport.errors import HostError, SandboxNotFound
from tests.helpers import assert_clock_on_time, vmm_pids_under
from tests.host.runtime.test_runtime_object_store import Host, runtimes, store_config

__all__ = ["store_config"]  # the fixture, shared


@pytest.fixture(scope="module")
async def two_hosts(host_config: HostConfig,
                    store_config: ObjectStoreConfig) -> AsyncIterator[tuple[Host, Host]]:
    """A source and a destination for the module: a new pair per test fetched the template
    from the store (and hashed it for the offer) again, most of each test's time."""
    async with runtimes(host_config, store_config) as make:
        yield await make(), await make()


@pytest.fixture
async def hosts(two_hosts: tuple[Host, Host]) -> AsyncIterator[tuple[Host, Host]]:
    """The module's hosts, with nothing of a test's left on either after it."""
    yield two_hosts
    for host in two_hosts:
        await host.rt.kill_all()
        assert [p.name for p in host.rt.sandboxes_dir.iterdir()] == []

pytestmark = pytest.mark.vm

# A process that holds a value only in its memory, and writes it out on SIGUSR1.
HOLDER = ("import os, signal, time\n"
          "v = os.urandom(16).hex()\n"
          "signal.signal(signal.SIGUSR1, lambda *a: open('/tmp/held', 'w').write(v))\n"
          "open('/tmp/holder-ready', 'w').close()\n"
          "while True: time.sleep(1)\n")


async def _held(sbx: SandboxHandle, pid: int) -> str:
    await sbx.exec("rm -f /tmp/held")
    await sbx.signal(pid, 10)
    for _ in range(100):
        if (await sbx.exec("test -s /tmp/held")).exit_code == 0:
            return (await sbx.read_file_bytes("/tmp/held")).decode()
        await asyncio.sleep(0.05)
    raise AssertionError("the holder did not answer")


async def _prepared(a: Host) -> tuple[SandboxHandle, int, str]:
    sbx = await a.rt.create()
    await sbx.write_file("/work/note", b"written before")
    await sbx.write_file("/work/holder.py", HOLDER.encode())
    pid = await sbx.spawn(["python3", "/work/holder.py"])
    for _ in range(200):
        if (await sbx.exec("test -e /tmp/holder-ready")).exit_code == 0:
            break
        await asyncio.sleep(0.05)
    return sbx, pid, await _held(sbx, pid)


async def migrate(a: Host, b: Host, sid: str) -> dict[str, object]:
    offer = await a.rt.migrations.offer(sid)
    ticket = await b.rt.migrations.accept(sid, offer, "127.0.0.1")
    handoff = await a.rt.migrations.send(sid, ticket)
    await b.rt.migrations.complete(sid, handoff)
    await a.rt.migrations.release(sid)
    return handoff


def _nothing_of(host: Host, sid: str) -> None:
    with pytest.raises(SandboxNotFound):
        host.rt.get(sid)
    assert not (host.rt.sandboxes_dir / sid).exists()
    assert vmm_pids_under(host.rt.sandboxes_dir / sid) == []


async def test_a_running_sandbox_moves_with_its_processes_memory_and_files(
        hosts: tuple[Host, Host]) -> None:
    a, b = hosts
    sbx, pid, value = await _prepared(a)
    started = time.monotonic()
    handoff = await migrate(a, b, sbx.id)
    print(f"\nmigration: {(time.monotonic() - started) * 1000:.0f} ms in all, {handoff}")

    _nothing_of(a, sbx.id)
    moved = b.rt.get(sbx.id)
    assert moved.state == "running" and moved.workdir.parent == b.rt.sandboxes_dir
    assert await moved.read_file_bytes("/work/note") == b"written before"
    assert any(p.get("pid") == pid and p.get("running") for p in await moved.procs())
    assert await _held(moved, pid) == value
    # An ordinary sandbox of its new host: it writes, snapshots and dies there.
    await moved.write_file("/work/after", b"written after")
    assert (await moved.exec("cat /work/note /work/after")).stdout == (
        b"written beforewritten after")
    await b.rt.snapshot(moved.id)
    await b.rt.kill(moved.id)
    _nothing_of(b, sbx.id)


async def test_a_destination_that_dies_before_the_switch_leaves_the_source_running(
        hosts: tuple[Host, Host], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = hosts
    sbx, pid, value = await _prepared(a)
    offer = await a.rt.migrations.offer(sbx.id)
    ticket = await b.rt.migrations.accept(sbx.id, offer, "127.0.0.1")
    incoming = b.rt.migrations._incoming[sbx.id].vm
    assert incoming is not None
    await asyncio.to_thread(incoming.kill)
    with monkeypatch.context() as shorter:
        # The destination hands the source's connection to its dead VMM: it retries that
        # VMM's refusing QMP socket for QMP_CONNECT_S (30 s in the product, 31 s of this
        # test's 40) before it closes the connection, which fails the send.
        shorter.setattr(qmp, "QMP_CONNECT_S", 5.0)
        with pytest.raises((HostError, OSError)):
            await a.rt.migrations.send(sbx.id, ticket)
    await b.rt.migrations.abort(sbx.id)
    _nothing_of(b, sbx.id)

    assert a.rt.get(sbx.id).state == "running"
    assert await _held(sbx, pid) == value
    assert await sbx.read_file_bytes("/work/note") == b"written before"
    # And it can still go: a second try to a live destination.
    await migrate(a, b, sbx.id)
    assert await _held(b.rt.get(sbx.id), pid) == value
    _nothing_of(a, sbx.id)


async def test_a_source_aborted_after_its_stop_runs_on_and_the_destination_leaves_nothing(
        hosts: tuple[Host, Host]) -> None:
    """The switch is the destination's `complete`: a source stopped by its stream resumes."""
    a, b = hosts
    sbx, pid, value = await _prepared(a)
    offer = await a.rt.migrations.offer(sbx.id)
    ticket = await b.rt.migrations.accept(sbx.id, offer, "127.0.0.1")
    await a.rt.migrations.send(sbx.id, ticket)
    await asyncio.sleep(2)  # the source's guest stands stopped, its clock too
    await b.rt.migrations.abort(sbx.id)
    await a.rt.migrations.abort(sbx.id)
    _nothing_of(b, sbx.id)
    assert a.rt.get(sbx.id).state == "running"
    assert await _held(sbx, pid) == value
    await assert_clock_on_time(sbx, why="the resumed source's clock is set again")
    await sbx.write_file("/work/later", b"still writes")
    assert await sbx.read_file_bytes("/work/later") == b"still writes"


async def test_a_wrong_token_is_refused(hosts: tuple[Host, Host]) -> None:
    a, b = hosts
    sbx, _pid, _value = await _prepared(a)
    offer = await a.rt.migrations.offer(sbx.id)
    ticket = await b.rt.migrations.accept(sbx.id, offer, "127.0.0.1")
    reader, writer = await asyncio.open_connection("127.0.0.1", ticket["port"])
    writer.write(b"x" * 32)
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 10) == b""  # closed on us
    writer.close()
    # The real source still gets in.
    await b.rt.migrations.complete(sbx.id, await a.rt.migrations.send(sbx.id, ticket))
    await a.rt.migrations.release(sbx.id)
    assert b.rt.get(sbx.id).state == "running"
    _nothing_of(a, sbx.id)
