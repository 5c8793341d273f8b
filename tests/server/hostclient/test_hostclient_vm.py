"""HostClient against a real `pandastack agent` process on a unix socket, with real microVMs:
create, exec with streamed output, a few MiB written and read back as streams, run_code on
code-interpreter, snapshot, create from it and fork, kill; SIGKILL of the agent makes the
next call (and a call in flight) HostUnavailable at once, and the restarted agent has
re-adopted the sandbox, which answers again. Nothing is left behind (live_agent checks)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import stat
from collections.abc import AsyncIterator

import pytest

from pandastack.hostport.errors import GuestOSError, HostUnavailable, SandboxNotFound
from pandastack.server.hostclient import HostClient
from tests.server.live_agent import LiveAgent, live_agent

pytestmark = pytest.mark.vm

PROMPTLY = 20.0  # a guard against a hang, far above what a refused connection takes


@pytest.fixture(scope="module")
async def agent() -> AsyncIterator[LiveAgent]:
    if os.geteuid() != 0:
        pytest.fail("VM tests need root")
    async with live_agent() as a:
        yield a


@pytest.fixture
async def client(agent: LiveAgent) -> AsyncIterator[HostClient]:
    async with HostClient(agent.url, agent.token) as c:
        yield c


def test_socket_and_token_file_are_private(agent: LiveAgent) -> None:
    for path in (agent.socket, agent.token_file):
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600, path


async def test_create_exec_files_kill(client: HostClient) -> None:
    sbx = await client.create("base")
    try:
        assert (sbx.state, sbx.is_alive()) == ("running", True)
        assert [s.id for s in await client.list_sandboxes()] == [sbx.id]
        seen: list[tuple[str, bytes]] = []

        async def on_stdout(data: bytes) -> None:
            seen.append(("out", data))

        result = await sbx.exec(
            "for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.05; done; exit 3",
            on_stdout=on_stdout, on_stderr=lambda d: seen.append(("err", d)))
        assert (result.exit_code, result.stdout, result.stderr) == (
            3, b"out1\nout2\nout3\n", b"err1\nerr2\nerr3\n")
        assert b"".join(d for k, d in seen if k == "out") == result.stdout
        assert b"".join(d for k, d in seen if k == "err") == result.stderr
        piped = await sbx.exec(["cat"], stdin=b"\x00piped\xff", env={"X": "1"})
        assert piped.stdout == b"\x00piped\xff"

        data = os.urandom(3 * 2**20 + 123)

        async def body() -> AsyncIterator[bytes]:
            for start in range(0, len(data), 256 * 2**10):
                yield data[start:start + 256 * 2**10]

        assert await sbx.write_file("/tmp/big", body(), mode=0o600) == len(data)
        chunks = [chunk async for chunk in sbx.read_file("/tmp/big")]
        assert len(chunks) > 1
        assert hashlib.sha256(b"".join(chunks)).digest() == hashlib.sha256(data).digest()
        info = await sbx.stat("/tmp/big")
        assert (info.size, info.mode & 0o777) == (len(data), 0o600)
        assert "big" in [e.name for e in await sbx.list_dir("/tmp")]
        with pytest.raises(GuestOSError) as missing:
            _ = [c async for c in sbx.read_file("/tmp/none")]
        assert missing.value.errno_name == "ENOENT" and missing.value.path == "/tmp/none"
        assert isinstance(await client.console_log(sbx.id, 4096), bytes)
    finally:
        await client.kill(sbx.id)
    with pytest.raises(SandboxNotFound):
        await client.get(sbx.id)


async def test_run_code(client: HostClient) -> None:
    sbx = await client.create("code-interpreter")
    try:
        events = [e async for e in sbx.run_code("print('hi')\n6 * 7")]
        assert events[-1].type == "end"
        assert "".join(e.text for e in events if e.type == "stdout") == "hi\n"
        results = [e for e in events if e.type == "result"]
        assert results and results[0].data and results[0].data["text/plain"] == "42"
    finally:
        await client.kill(sbx.id)


async def test_snapshot_create_from_it_and_fork(client: HostClient) -> None:
    sbx = await client.create("base")
    made = [sbx.id]
    snapshot_id = None
    try:
        await sbx.write_file("/root/mark", b"before the snapshot\n")
        snap = await client.snapshot(sbx.id, "hostclient-vm")
        snapshot_id = snap.info.id
        assert (await client.snapshot_info(snapshot_id)) == snap.info
        assert snapshot_id in [i.id for i in await client.list_snapshots()]
        restored = await client.create(snapshot=snapshot_id)
        made.append(restored.id)
        assert (await restored.exec("cat /root/mark")).stdout == b"before the snapshot\n"
        forks = await client.fork(sbx.id, 1)
        made += [f.id for f in forks]
        assert (await forks[0].exec("cat /root/mark")).stdout == b"before the snapshot\n"
    finally:
        for sandbox_id in made:
            await client.kill(sandbox_id)
        if snapshot_id is not None:
            await client.delete_snapshot(snapshot_id)
    assert await client.list_sandboxes() == []
    assert await client.list_snapshots() == []


async def test_agent_killed_then_restarted(agent: LiveAgent, client: HostClient) -> None:
    sbx = await client.create("base")
    try:
        await sbx.write_file("/root/kept", b"still here\n")
        in_flight = asyncio.create_task(sbx.exec("sleep 60"))
        await asyncio.sleep(1)  # let the exec reach the guest
        agent.signal(signal.SIGKILL)
        with pytest.raises(HostUnavailable, match=f"host agent at {agent.url}"):
            await asyncio.wait_for(in_flight, PROMPTLY)
        with pytest.raises(HostUnavailable, match=f"host agent at {agent.url}"):
            await asyncio.wait_for(sbx.exec("true"), PROMPTLY)
        with pytest.raises(HostUnavailable):
            await asyncio.wait_for(client.get(sbx.id), PROMPTLY)
        agent.start()
        again = await client.get(sbx.id)  # the same client: its pool reconnects
        assert again.state == "running"
        assert (await again.exec("cat /root/kept")).stdout == b"still here\n"
    finally:
        await client.kill(sbx.id)


async def test_volumes_over_the_host_api(client: HostClient) -> None:
    from pandastack.hostport.errors import VolumeInUse, VolumeNotFound
    from pandastack.hostport.volumes import VolumeMountRequest
    from pandastack.rules import new_volume_id

    volume_id = new_volume_id()
    made = await client.create_volume(volume_id, 32)
    assert (made.id, made.size_mb, made.attached_to) == (volume_id, 32, ())
    sbx = await client.create(volumes=[VolumeMountRequest(volume_id, "/data")])
    try:
        result = await sbx.exec(["sh", "-c", "echo hi > /data/f && cat /data/f"])
        assert result.stdout == b"hi\n"
        assert (await client.get_volume(volume_id)).attached_to == (sbx.id,)
        with pytest.raises(VolumeInUse):
            await client.delete_volume(volume_id)
    finally:
        await client.kill(sbx.id)
    assert [v.id for v in await client.list_volumes()] == [volume_id]
    assert (await client.resize_volume(volume_id, 48)).size_mb == 48
    await client.delete_volume(volume_id)
    with pytest.raises(VolumeNotFound):
        await client.get_volume(volume_id)
