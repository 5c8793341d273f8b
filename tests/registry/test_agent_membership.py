"""Real `pandastack agent --db` processes on real microVMs and a real PostgreSQL: they
register (the same id again; a new epoch only after going stale or being fenced), report what
they hold at each heartbeat, lease every sandbox before its VM starts and release it at kill,
and kill what is not theirs: at start after a fence, after a fence while they were stopped,
and after a partition from the database during which they paused their VMs. Staleness is
waited for in the database's own terms (`stale_hosts`), never by a fixed sleep."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import make_url

from pandastack.cli.agent import VCPU_OVERCOMMIT
from pandastack.hostport.errors import HostUnavailable
from pandastack.registry import Host, Registry
from pandastack.server.hostclient import HostClient
from tests.registry.conftest import member_agent, registry_of
from tests.registry.proxy import TcpProxy
from tests.server.live_agent import LiveAgent

pytestmark = [pytest.mark.vm, pytest.mark.timeout(600)]
# The tests whose agent goes stale after 3 s (FAST) are `serial`: beside a second test
# worker's VMs a heartbeat came late and fenced a host mid-test. Those stale after 60 s
# (SLOW, or a heartbeat every 30 s) fence only when the test says so: the parallel lane.
serial = pytest.mark.serial

WAIT_S = 120.0  # a bound on every wait for the agent (TCG, a shared machine)
FAST = ("--heartbeat-s", "0.5", "--stale-after-s", "3")
SLOW = ("--heartbeat-s", "0.5", "--stale-after-s", "60")  # never stale in a test


async def until(what: str, check: Callable[[], Awaitable[bool]], agent: LiveAgent) -> None:
    deadline = time.monotonic() + WAIT_S
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n{agent.log_tail()}")
        await asyncio.sleep(0.1)


def only_host(registry: Registry) -> Host:
    hosts = registry.list_hosts()
    assert len(hosts) == 1, hosts
    return hosts[0]


def status_of(agent: LiveAgent) -> tuple[int, str]:
    """The agent's answer to GET /v1/host: status and error type (empty on success)."""
    transport = httpx.HTTPTransport(uds=str(agent.socket))
    with httpx.Client(transport=transport, base_url="http://agent") as client:
        r = client.get("/v1/host", headers={"Authorization": f"Bearer {agent.token}"},
                       timeout=10)
    return r.status_code, r.json().get("error", {}).get("type", "") if r.is_error else ""


def record_state(agent: LiveAgent, sid: str) -> str | None:
    try:
        state: str = json.loads((agent.state_dir / sid / "sandbox.json").read_text())["state"]
    except FileNotFoundError:
        return None
    return state


def vm_pid(agent: LiveAgent, sid: str) -> int | None:
    path = agent.state_dir / sid / "sandbox.json"
    pid = json.loads(path.read_text()).get("pid") if path.exists() else None
    return int(pid) if pid else None


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie whose parent has not reaped it yet does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


async def test_register_heartbeat_lease_and_restart_keeps_epoch_and_vm(pg_dsn: str) -> None:
    with registry_of(pg_dsn) as registry:
        async with member_agent(pg_dsn, *SLOW, "--label", "zone=a") as agent:
            agent.start()
            host = only_host(registry)
            assert host.endpoint == f"unix:{agent.socket.resolve()}"
            assert (host.epoch, host.labels, host.fenced) == (1, {"zone": "a"}, False)
            assert host.vcpus == VCPU_OVERCOMMIT * (os.cpu_count() or 1)
            assert host.memory_mb > 0 and host.disk_mb > 0
            assert host.version

            async with HostClient(agent.url, agent.token) as client:
                sandbox = await client.create("base")
                lease = registry.lease_of(sandbox.id)
                assert lease is not None and (lease.host_id, lease.epoch) == (host.id, 1)

                async def reported() -> bool:
                    got = registry.get_host(host.id)
                    return got is not None and (got.sandboxes, got.used_vcpus) == (1, 1)
                await until("the heartbeat to report the sandbox", reported, agent)
                got = registry.get_host(host.id)
                assert got is not None and "base" in got.templates and got.used_memory_mb > 0

            # SIGTERM keeps the VM; an agent back before the host is stale keeps its id,
            # its epoch and the sandbox.
            assert agent.signal(signal.SIGTERM) == 0
            agent.start()
            again = only_host(registry)
            assert (again.id, again.epoch) == (host.id, 1)
            async with HostClient(agent.url, agent.token) as client:
                assert [s.id for s in await client.list_sandboxes()] == [sandbox.id]
                assert (await (await client.get(sandbox.id)).exec("echo hi")).stdout == b"hi\n"
                await client.kill(sandbox.id)
            assert registry.lease_of(sandbox.id) is None


async def test_an_agent_fenced_while_down_kills_its_vm_before_it_serves(pg_dsn: str) -> None:
    with registry_of(pg_dsn) as registry:
        async with member_agent(pg_dsn, *SLOW) as agent:
            agent.start()
            async with HostClient(agent.url, agent.token) as client:
                sandbox = await client.create("base")
            pid = vm_pid(agent, sandbox.id)
            assert pid is not None and alive(pid)
            assert agent.signal(signal.SIGTERM) == 0
            assert alive(pid)  # the VM outlives the agent

            host = only_host(registry)
            assert registry.fence(host.id) == 2
            agent.start()  # returns at the first answer of the host API
            async with HostClient(agent.url, agent.token) as client:
                assert await client.list_sandboxes() == []
            assert not alive(pid)
            back = only_host(registry)
            assert (back.id, back.epoch, back.fenced) == (host.id, 3, False)


@serial
async def test_an_agent_fenced_while_stopped_kills_its_vms_then_serves_again(
        pg_dsn: str) -> None:
    with registry_of(pg_dsn) as registry:
        async with member_agent(pg_dsn, *FAST) as agent:
            agent.start()
            async with HostClient(agent.url, agent.token) as client:
                sandbox = await client.create("base")
            pid = vm_pid(agent, sandbox.id)
            host = only_host(registry)
            assert pid is not None and agent.proc is not None

            agent.proc.send_signal(signal.SIGSTOP)
            try:
                async def stale() -> bool:
                    return host.id in {h.id for h in registry.stale_hosts(3.0)}
                await until("the stopped agent to go stale", stale, agent)
                # As an API server's reaper does: only if still stale at that epoch.
                assert registry.fence(host.id, epoch=1, older_than_seconds=3.0) == 2
            finally:
                agent.proc.send_signal(signal.SIGCONT)

            async def serving_again() -> bool:
                return status_of(agent) == (200, "")
            await until("the fenced agent to serve again", serving_again, agent)
            assert not alive(pid) and record_state(agent, sandbox.id) is None
            back = only_host(registry)
            assert (back.id, back.epoch) == (host.id, 3)
            async with HostClient(agent.url, agent.token) as client:
                assert await client.list_sandboxes() == []
                fresh = await client.create("base")
                lease = registry.lease_of(fresh.id)
                assert lease is not None and (lease.host_id, lease.epoch) == (host.id, 3)
                await client.kill(fresh.id)


@serial
async def test_a_partitioned_agent_pauses_its_vms_and_resumes_or_kills_them(
        pg_dsn: str) -> None:
    url = make_url(pg_dsn)
    proxy = TcpProxy((url.host or "127.0.0.1", url.port or 5432))
    proxy.start()
    via_proxy = url.set(port=proxy.port).render_as_string(hide_password=False)
    try:
        with registry_of(pg_dsn) as registry:
            async with member_agent(via_proxy, *FAST) as agent:
                agent.start()
                async with HostClient(agent.url, agent.token) as client:
                    sandbox = await client.create("base")
                host = only_host(registry)

                async def refused() -> bool:
                    return status_of(agent) == (503, "HostUnavailable")

                async def paused() -> bool:
                    return record_state(agent, sandbox.id) == "paused"

                async def serving() -> bool:
                    return status_of(agent) == (200, "")

                # Cut off, not fenced: it pauses and refuses; back, it resumes and serves.
                proxy.stop()
                await until("the cut-off agent to refuse calls", refused, agent)
                await until("the cut-off agent to pause its VM", paused, agent)
                proxy.start()
                await until("the agent to serve again", serving, agent)
                assert record_state(agent, sandbox.id) == "running"
                assert only_host(registry).epoch == 1
                async with HostClient(agent.url, agent.token) as client:
                    out = await (await client.get(sandbox.id)).exec("echo back")
                    assert out.stdout == b"back\n"

                # Cut off and fenced meanwhile: back, it kills the VM and serves under a
                # new epoch.
                pid = vm_pid(agent, sandbox.id)
                assert pid is not None
                proxy.stop()
                await until("the cut-off agent to refuse calls", refused, agent)
                assert registry.fence(host.id) == 2
                proxy.start()
                await until("the fenced agent to serve again", serving, agent)
                assert not alive(pid) and record_state(agent, sandbox.id) is None
                assert only_host(registry).epoch == 3
                async with HostClient(agent.url, agent.token) as client:
                    assert await client.list_sandboxes() == []
    finally:
        proxy.stop()


async def test_a_create_whose_lease_is_refused_leaves_nothing(pg_dsn: str) -> None:
    """Fenced between two heartbeats (30 s apart here): the agent still serves, but the
    lease it takes before the VM starts is refused, so no VM starts."""
    with registry_of(pg_dsn) as registry:
        async with member_agent(pg_dsn, "--heartbeat-s", "30", "--stale-after-s", "60") \
                as agent:
            agent.start()
            host = only_host(registry)
            assert registry.fence(host.id) == 2
            async with HostClient(agent.url, agent.token) as client:
                with pytest.raises(HostUnavailable, match="fenced"):
                    await client.create("base", sandbox_id="sbx-0123456789ab")
                assert await client.list_sandboxes() == []
            assert registry.lease_of("sbx-0123456789ab") is None
            assert not (agent.state_dir / "sbx-0123456789ab").exists()
