"""Per-sandbox networks: egress policy, isolation, forks, cleanup.

Traffic only goes to a test "internet" host that lives in a namespace this module creates
( the benchmarking range, routed to that namespace), never anywhere else.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from pandastack.host.config import HostConfig
from pandastack.host.network import NetworkManager, NetworkPolicy, Slot, list_netns
from pandastack.host.runtime import HostRuntime
from pandastack.host.sandbox import SandboxHandle
from tests.helpers import SandboxFactory

# Per test process, so that concurrent sessions on one machine do not collide.
_NET = os.getpid() % 250
INET_NS = f"pst-inet-{os.getpid()}"
INET_VETH = f"pti{os.getpid()}"[:15]
INET_IP = f"198.18.{_NET}.1"
HOST_SIDE_IP = f"198.18.{_NET}.254"
PORT = 8080


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check)


@pytest.fixture(scope="module")
def internet_host() -> Iterator[str]:
    server: subprocess.Popen[bytes] | None = None
    try:
        sh("ip", "netns", "add", INET_NS)
        sh("ip", "link", "add", INET_VETH, "type", "veth", "peer", "name", "eth0",
           "netns", INET_NS)
        sh("ip", "addr", "add", f"{HOST_SIDE_IP}/24", "dev", INET_VETH)
        sh("ip", "link", "set", INET_VETH, "up")
        sh("ip", "-n", INET_NS, "addr", "add", f"{INET_IP}/24", "dev", "eth0")
        sh("ip", "-n", INET_NS, "link", "set", "eth0", "up")
        sh("ip", "-n", INET_NS, "link", "set", "lo", "up")
        sh("ip", "-n", INET_NS, "route", "add", "default", "via", HOST_SIDE_IP)
        # Network safety: the address must route into our namespace before anything
        # talks to it.
        assert f"dev {INET_VETH}" in sh("ip", "route", "get", INET_IP).stdout
        server = subprocess.Popen(["ip", "netns", "exec", INET_NS, sys.executable, "-m",
                                   "http.server", str(PORT), "--bind", INET_IP],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  cwd=Path(__file__).parent)
        deadline = time.monotonic() + 60
        while f"{INET_IP}:{PORT}" not in sh("ip", "netns", "exec", INET_NS, "ss", "-ltn",
                                            check=False).stdout:
            assert time.monotonic() < deadline, "test internet host did not start"
            time.sleep(0.05)
        yield f"http://{INET_IP}:{PORT}/"
    finally:
        if server is not None:
            server.kill()
            server.wait()
        sh("ip", "netns", "del", INET_NS, check=False)
        sh("ip", "link", "del", INET_VETH, check=False)


async def reaches(sbx: SandboxHandle, url: str) -> bool:
    result = await sbx.exec(["curl", "-s", "-o", "/dev/null", "-m", "3", url])
    return result.exit_code == 0


pytestmark = pytest.mark.vm


async def test_internet_on_off_and_allow_list(internet_host: str,
                                              sandbox_factory: SandboxFactory,
                                              runtime: HostRuntime) -> None:
    open_sbx = await sandbox_factory()
    assert await reaches(open_sbx, internet_host)
    closed = await sandbox_factory(network={"internet": False})
    assert not await reaches(closed, internet_host)
    allowed = await sandbox_factory(network={"internet": False, "allow_out": [f"{INET_IP}/32"]})
    assert await reaches(allowed, internet_host)
    denied = await sandbox_factory(network={"internet": True, "deny_out": [f"{INET_IP}/24"]})
    assert not await reaches(denied, internet_host)
    await runtime.update_network(closed.id, {"internet": True})
    assert await reaches(closed, internet_host)
    await runtime.update_network(open_sbx.id, {"internet": False})
    assert not await reaches(open_sbx, internet_host)


async def test_no_reaching_the_host_or_other_sandboxes(internet_host: str,
                                                       sandbox_factory: SandboxFactory,
                                                       runtime: HostRuntime) -> None:
    host_server = subprocess.Popen([sys.executable, "-m", "http.server", "18999", "--bind",
                                    "0.0.0.0"], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, cwd=Path(__file__).parent)
    try:
        a = await sandbox_factory(network={"internet": True})
        b = await sandbox_factory(network={"internet": True})
        sa, sb = runtime.describe(a.id)["slot"], runtime.describe(b.id)["slot"]
        assert isinstance(sa, Slot) and isinstance(sb, Slot)
        await b.spawn(["python3", "-m", "http.server", "8000"])
        await asyncio.sleep(0.5)
        assert not await reaches(a, f"http://{sa.host_ip}:18999/"), "reached the host"
        assert not await reaches(a, f"http://{sb.ns_ip}:8000/"), "reached another sandbox"
        assert not await reaches(a, "http://10.0.2.2:18999/")
        assert await reaches(a, internet_host), "the sandbox has network at all"
    finally:
        host_server.kill()
        host_server.wait()


async def test_forks_share_the_address_and_each_reach_out(internet_host: str,
                                                          sandbox_factory: SandboxFactory,
                                                          runtime: HostRuntime) -> None:
    parent = await sandbox_factory()
    children = await runtime.fork(parent.id, count=2)
    try:
        for child in children:
            addr = await child.exec("ip -4 -o addr show eth0")
            assert b"169.254.0.21/30" in addr.stdout
            assert await reaches(child, internet_host)
        slots = {runtime.describe(c.id)["slot"] for c in [parent, *children]}
        assert len(slots) == 3
    finally:
        for child in children:
            await runtime.kill(child.id)


async def test_guest_network_is_ipv4_only(sandbox_factory: SandboxFactory) -> None:
    sbx = await sandbox_factory()
    eth0 = await sbx.exec("ip -6 -o addr show dev eth0")
    assert eth0.exit_code == 0 and eth0.stdout == b"", eth0.stdout
    lo = await sbx.exec("ip -6 -o addr show dev lo")
    assert b"::1/128" in lo.stdout


async def test_a_restored_guest_sends_nothing_by_itself(sandbox_factory: SandboxFactory) -> None:
    # No self-announce after the restore (QEMU's would send ~5 rounds of gratuitous ARP and
    # neighbour adverts over ~0.5 s) and no IPv6 router solicitations.
    sbx = await sandbox_factory()
    count = ["cat", "/sys/class/net/eth0/statistics/tx_packets"]
    before = int((await sbx.exec(count)).stdout)
    await asyncio.sleep(1.5)
    after = int((await sbx.exec(count)).stdout)
    assert after == before, f"the guest sent {after - before} packets unasked"


async def test_kill_removes_namespace_and_claim(sandbox_factory: SandboxFactory,
                                                runtime: HostRuntime) -> None:
    sbx = await sandbox_factory()
    slot = runtime.describe(sbx.id)["slot"]
    assert isinstance(slot, Slot)
    index = slot.index
    assert f"psn-{index}" in list_netns()
    await runtime.kill(sbx.id)
    assert f"psn-{index}" not in list_netns()
    assert index not in runtime.network.claims()
    assert not Path(f"/sys/class/net/psv{index}").exists()


def test_allocator_cycles_leave_nothing(tmp_path: Path) -> None:
    manager = NetworkManager(tmp_path / "claims")
    assert manager.capacity == 16384
    owners = tmp_path / "owners"
    owners.mkdir()
    seen = set()
    for i in range(1000):
        slot = manager.claim(owners)
        assert slot.index not in manager.claims() or manager.claims()[slot.index] == owners
        seen.add(slot.index)
        manager.release(slot)
        if i % 100 == 0:
            held = [manager.claim(owners) for _ in range(50)]
            assert len({s.index for s in held}) == 50  # never double-allocated
            for s in held:
                manager.release(s)
    assert manager.claims() == {}
    assert len(seen) > 900  # spread over the pool, O(1) probes


def test_policy_validation() -> None:
    assert NetworkPolicy.from_dict(None) == NetworkPolicy()
    with pytest.raises(ValueError):
        NetworkPolicy.from_dict({"internet": "yes"})
    with pytest.raises(ValueError):
        NetworkPolicy.from_dict({"allow_out": ["not a name!"]})
    with pytest.raises(ValueError):
        NetworkPolicy.from_dict({"bogus": 1})
    assert NetworkPolicy.from_dict({"allow_out": ["203.0.113.7"]}).cidrs()[0] == \
        ["203.0.113.7/32"]


@pytest.fixture
async def dns_runtime(internet_host: str, host_config: HostConfig) -> AsyncIterator[HostRuntime]:
    """A runtime whose guests' DNS goes to a stub resolver in the test internet namespace."""
    stub = subprocess.Popen(["ip", "netns", "exec", INET_NS, sys.executable,
                             str(Path(__file__).with_name("dns_stub.py")), INET_IP,
                             "files.pandastack.test", INET_IP],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = Path(tempfile.mkdtemp(prefix="psd-", dir="/tmp"))
    rt = HostRuntime(HostConfig(home=host_config.home, state_dir=state,
                                snapshots_root=host_config.snapshots_root, dns=INET_IP),
                     progress=lambda m: None)
    await rt.start()
    try:
        yield rt
    finally:
        await rt.kill_all()
        await rt.close()
        stub.kill()
        stub.wait()
        assert list(state.iterdir()) == []
        state.rmdir()


async def test_guest_dns_follows_the_policy(dns_runtime: HostRuntime) -> None:
    online = await dns_runtime.create(network={"internet": True})
    lookup = await online.exec(["getent", "ahostsv4", "files.pandastack.test"], timeout=30)
    assert lookup.exit_code == 0 and INET_IP.encode() in lookup.stdout, lookup
    assert await reaches(online, f"http://files.pandastack.test:{PORT}/")
    offline = await dns_runtime.create(network={"internet": False})
    lookup = await offline.exec(["getent", "ahostsv4", "files.pandastack.test"], timeout=30)
    assert lookup.exit_code != 0, "DNS is a way out: closed when the sandbox has no egress"


async def test_fifty_vm_cycles_leave_no_namespace_link_or_claim(runtime: HostRuntime) -> None:
    def ours() -> dict[int, Path]:
        return {i: o for i, o in runtime.network.claims().items()
                if str(o).startswith(str(runtime.sandboxes_dir))}

    for _ in range(50):
        sbx = await runtime.create()
        await runtime.kill(sbx.id)
    held = ours()
    # What remains is the prepared spares, nothing per sandbox.
    assert all(o.name == ".spare-slots" for o in held.values()), held
    assert len(held) <= 2
    claimed = runtime.network.claims()
    for name in list_netns():
        if name.startswith("psn-"):
            assert int(name[4:]) in claimed, f"namespace {name} without a claim"
    links = Path("/sys/class/net")
    for link in links.iterdir():
        if link.name.startswith("psv"):
            assert int(link.name[3:]) in claimed, f"host veth {link.name} without a claim"
