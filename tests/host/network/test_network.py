"""Per-sandbox networks: egress policy, isolation, forks, cleanup.

Traffic only goes to a test "internet" host that lives in a namespace this module creates
( the benchmarking range, routed to that namespace; plus one CGNAT address there, standing
for the always-denied ranges), never anywhere else.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from pandastack.host.config import HostConfig
from pandastack.host.network.manager import NetworkManager, Slot, list_netns
from pandastack.host.runtime import HostRuntime
from pandastack.host.runtime.sandbox import SandboxHandle
from pandastack.hostport.network import ALWAYS_DENIED, NetworkPolicy, denied_part, hard_denied
from tests.helpers import SandboxFactory
from tests.leftovers import owned_tmpdir

# Per test process, so that concurrent sessions on one machine do not collide.
_NET = os.getpid() % 250
INET_NS = f"pst-inet-{os.getpid()}"
INET_VETH = f"pti{os.getpid()}"[:15]
INET_IP = f"198.18.{_NET}.1"
HOST_SIDE_IP = f"198.18.{_NET}.254"
# An always-denied address (CGNAT) that lives in the test namespace too.
DENIED_IP = f"100.64.{_NET}.1"
DENIED_HOST_SIDE_IP = f"100.64.{_NET}.254"
DENIED_NET = f"100.64.{_NET}.0/24"
PORT = 8080


# `python -m http.server` without its name lookup (HTTPServer.server_bind's getfqdn): from the
# test namespace that is a DNS query routed out through the host to a resolver no test may
# reach, and it waited ~10 s for an answer that never came; in a guest (whose DNS is off
# here) it took ~3 s of the server's start, more than 30 s at load 20.
FILE_SERVER = """
import http.server, socketserver, sys
class Server(http.server.ThreadingHTTPServer):
    def server_bind(self):
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]
Server((sys.argv[1], int(sys.argv[2])), http.server.SimpleHTTPRequestHandler).serve_forever()
"""


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check)


@pytest.fixture(scope="module")
def internet_host() -> Iterator[str]:
    servers: list[subprocess.Popen[bytes]] = []
    try:
        sh("ip", "netns", "add", INET_NS)
        sh("ip", "link", "add", INET_VETH, "type", "veth", "peer", "name", "eth0",
           "netns", INET_NS)
        sh("ip", "addr", "add", f"{HOST_SIDE_IP}/24", "dev", INET_VETH)
        sh("ip", "addr", "add", f"{DENIED_HOST_SIDE_IP}/24", "dev", INET_VETH)
        sh("ip", "link", "set", INET_VETH, "up")
        sh("ip", "-n", INET_NS, "addr", "add", f"{INET_IP}/24", "dev", "eth0")
        sh("ip", "-n", INET_NS, "addr", "add", f"{DENIED_IP}/24", "dev", "eth0")
        sh("ip", "-n", INET_NS, "link", "set", "eth0", "up")
        sh("ip", "-n", INET_NS, "link", "set", "lo", "up")
        sh("ip", "-n", INET_NS, "route", "add", "default", "via", HOST_SIDE_IP)
        # Network safety: the addresses must route into our namespace before anything
        # talks to them.
        for ip in (INET_IP, DENIED_IP):
            assert f"dev {INET_VETH}" in sh("ip", "route", "get", ip).stdout
        for ip in (INET_IP, DENIED_IP):
            servers.append(subprocess.Popen(
                ["ip", "netns", "exec", INET_NS, sys.executable, "-c", FILE_SERVER, ip,
                 str(PORT)], stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, cwd=Path(__file__).parent))
        deadline = time.monotonic() + 60
        while not all(f"{ip}:{PORT}" in sh("ip", "netns", "exec", INET_NS, "ss", "-ltn",
                                           check=False).stdout for ip in (INET_IP, DENIED_IP)):
            assert time.monotonic() < deadline, "test internet host did not start"
            time.sleep(0.05)
        yield f"http://{INET_IP}:{PORT}/"
    finally:
        for server in servers:
            server.kill()
            server.wait()
        sh("ip", "netns", "del", INET_NS, check=False)
        sh("ip", "link", "del", INET_VETH, check=False)


async def reaches(sbx: SandboxHandle, url: str) -> bool:
    # Only ever asserted true: a long bound costs nothing when the way is open, and a loaded
    # TCG guest can take seconds for a whole request (refusals: `reaches_none`).
    result = await sbx.exec(["curl", "-s", "-o", "/dev/null", "-m", "30", url], timeout=60)
    return result.exit_code == 0


# A dropped connection fails at its handshake, which (guest kernel to guest kernel or to a
# namespace on this machine) takes milliseconds when it is let through: 2 s for it, not the
# 3 s of a whole request per refusal. Refusals checked together wait for one timeout.
async def reaches_none(*probes: tuple[SandboxHandle, str]) -> bool:
    async def one(sbx: SandboxHandle, url: str) -> bool:
        result = await sbx.exec(["curl", "-s", "-o", "/dev/null", "--connect-timeout", "2",
                                 "-m", "3", url])
        return result.exit_code == 0

    return not any(await asyncio.gather(*(one(sbx, url) for sbx, url in probes)))


pytestmark = pytest.mark.vm


async def test_internet_on_off_and_allow_list(internet_host: str,
                                              sandbox_factory: SandboxFactory,
                                              runtime: HostRuntime) -> None:
    open_sbx = await sandbox_factory()
    assert await reaches(open_sbx, internet_host)
    closed = await sandbox_factory(network={"internet": False})
    allowed = await sandbox_factory(network={"internet": False, "allow_out": [f"{INET_IP}/32"]})
    assert await reaches(allowed, internet_host)
    denied = await sandbox_factory(network={"internet": True, "deny_out": [f"{INET_IP}/24"]})
    assert await reaches_none((closed, internet_host), (denied, internet_host))
    await runtime.update_network(closed.id, {"internet": True})
    assert await reaches(closed, internet_host)
    await runtime.update_network(open_sbx.id, {"internet": False})
    assert await reaches_none((open_sbx, internet_host))


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
        await b.spawn(["python3", "-c", FILE_SERVER, "0.0.0.0", "8000"])
        # Both servers answer before anything is refused: a refusal by a closed port would
        # prove nothing.
        await wait_answering(f"http://{sb.ns_ip}:8000/")
        await wait_answering(f"http://{sa.host_ip}:18999/")
        assert await reaches(a, internet_host), "the sandbox has network at all"
        assert await reaches_none((a, f"http://{sa.host_ip}:18999/"),
                                  (a, f"http://{sb.ns_ip}:8000/"),
                                  (a, "http://10.0.2.2:18999/")), \
            "reached the host or another sandbox"
    finally:
        host_server.kill()
        host_server.wait()


async def test_allow_out_never_opens_the_always_denied_set(internet_host: str,
                                                          sandbox_factory: SandboxFactory,
                                                          runtime: HostRuntime) -> None:
    denied = f"http://{DENIED_IP}:{PORT}/"
    wide = await sandbox_factory(network={"internet": False, "allow_out": ["0.0.0.0/0"]})
    assert await reaches(wide, internet_host), "the public part of 0.0.0.0/0 is open"
    assert await reaches_none((wide, denied)), "0.0.0.0/0 opened an always-denied range"
    await runtime.update_network(wide.id, {"internet": False, "allow_out": [DENIED_NET]})
    assert await reaches_none((wide, denied)), "a tenant's allow_out opened a denied range"


async def test_the_operator_list_lets_allow_out_open_a_denied_range(
        internet_host: str, host_config: HostConfig) -> None:
    state = owned_tmpdir("pso-")
    rt = HostRuntime(dataclasses.replace(host_config, state_dir=state,
                                         network_operator_allow=(DENIED_NET,)),
                     progress=lambda m: None)
    await rt.start()
    denied = f"http://{DENIED_IP}:{PORT}/"
    try:
        sbx = await rt.create(network={"internet": False, "allow_out": [DENIED_NET]})
        assert await reaches(sbx, denied)
        # The operator's list only says what a policy may open: without the entry, closed.
        await rt.update_network(sbx.id, {"internet": True})
        assert await reaches_none((sbx, denied))
        assert await reaches(sbx, internet_host)
    finally:
        await rt.kill_all()
        await rt.close()
        assert list(state.iterdir()) == []
        state.rmdir()


COUNT_TABLE = "pst_count"
FORGED_PORT, LEGIT_PORT = 9999, 9998
FORGE = f"""
import socket, struct, sys
dst, forged, guest = sys.argv[1:4]
def packet(src, dport):
    payload = b"pandastack test"
    udp = struct.pack("!HHHH", 40000, dport, 8 + len(payload), 0) + payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0,
                     socket.inet_aton(src), socket.inet_aton(dst))
    return ip + udp
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
for src, port in ((forged, {FORGED_PORT}), (guest, {LEGIT_PORT})):
    for _ in range(3):
        s.sendto(packet(src, port), (dst, 0))
"""


def inet_counter(name: str) -> int:
    out = sh("ip", "netns", "exec", INET_NS, "nft", "-j", "list", "counter", "ip",
             COUNT_TABLE, name).stdout
    return int(next(item["counter"]["packets"] for item in json.loads(out)["nftables"]
                    if "counter" in item))


async def test_packets_with_a_forged_source_do_not_leave_the_namespace(
        internet_host: str, sandbox_factory: SandboxFactory) -> None:
    ruleset = f"""
table ip {COUNT_TABLE} {{
    counter forged {{}}
    counter legit {{}}
    chain pre {{
        type filter hook prerouting priority -300; policy accept;
        udp dport {FORGED_PORT} counter name "forged"
        udp dport {LEGIT_PORT} counter name "legit"
    }}
}}
"""
    subprocess.run(["ip", "netns", "exec", INET_NS, "nft", "-f", "-"], input=ruleset,
                   text=True, check=True)
    try:
        sbx = await sandbox_factory(network={"internet": True})
        # The forged source lies in the test namespace's own subnet, so that even an answer
        # to it (ICMP) stays there.
        forged = f"198.18.{_NET}.77"
        sent = await sbx.exec(["python3", "-c", FORGE, INET_IP, forged, "169.254.0.21"],
                              timeout=60)
        assert sent.exit_code == 0, sent
        deadline = time.monotonic() + 10
        while inet_counter("legit") < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert inet_counter("legit") == 3, "the guest's own packets get out"
        assert inet_counter("forged") == 0, "packets with a forged source left the sandbox"
    finally:
        sh("ip", "netns", "exec", INET_NS, "nft", "delete", "table", "ip", COUNT_TABLE,
           check=False)


def curl(url: str, *prefix: str) -> bool:
    return sh(*prefix, "curl", "-s", "-o", "/dev/null", "-m", "3", url,
              check=False).returncode == 0


async def wait_answering(url: str) -> None:
    """Until `url` answers the host (as the runtime's user), boundedly."""
    deadline = time.monotonic() + 60
    while not await asyncio.to_thread(curl, url):
        assert time.monotonic() < deadline, f"{url} never answered the host"
        await asyncio.sleep(0.2)


async def host_reaches_none(url: str, *prefixes: tuple[str, ...]) -> bool:
    """Whether none of `prefixes` (commands that run curl as someone else) reach `url`; the
    refusals wait for one connect timeout together (see `reaches_none`)."""
    def one(prefix: tuple[str, ...]) -> bool:
        return sh(*prefix, "curl", "-s", "-o", "/dev/null", "--connect-timeout", "2", "-m",
                  "3", url, check=False).returncode == 0

    return not any(await asyncio.gather(*(asyncio.to_thread(one, p) for p in prefixes)))


async def test_only_the_runtime_opens_connections_into_a_guest(
        internet_host: str, sandbox_factory: SandboxFactory, runtime: HostRuntime) -> None:
    sbx = await sandbox_factory(network={"internet": True})
    slot = runtime.describe(sbx.id)["slot"]
    assert isinstance(slot, Slot)
    await sbx.spawn(["python3", "-c", FILE_SERVER, "0.0.0.0", "8000"], cwd="/tmp")
    url = f"http://{slot.ns_ip}:8000/"
    # What the port proxy does: from the host, as the runtime's user.
    await wait_answering(url)
    # A neighbour that routes to the pool (the test namespace's default route is the host),
    # and another user on the host.
    assert await host_reaches_none(
        url, ("ip", "netns", "exec", INET_NS),
        ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")), \
        "a neighbour or an unprivileged local user reached the guest"
    assert await reaches(sbx, internet_host), "replies to the guest's own connections pass"


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


def test_what_no_policy_opens_is_the_always_denied_set_less_the_operators_list() -> None:
    everything = ipaddress.IPv4Network("0.0.0.0/0")
    denied = set(ipaddress.collapse_addresses(ipaddress.IPv4Network(n) for n in ALWAYS_DENIED))
    assert set(hard_denied()) == denied
    holed = hard_denied(("10.1.0.0/16", "169.254.169.254/32"))
    for inside in ("10.1.0.0", "10.1.255.255", "169.254.169.254"):
        assert not any(ipaddress.IPv4Address(inside) in net for net in holed), inside
    for outside in ("10.0.255.255", "10.2.0.0", "169.254.169.253", "169.254.169.255",
                    "127.0.0.1"):
        assert any(ipaddress.IPv4Address(outside) in net for net in holed), outside
    # The holes are exact: what is left plus the holes is the whole denied set again.
    left = sum(net.num_addresses for net in holed)
    assert left == sum(net.num_addresses for net in denied) - (1 << 16) - 1
    assert hard_denied((str(everything),)) == ()
    assert denied_part("0.0.0.0/0") == [str(net) for net in hard_denied()]
    assert denied_part("10.1.2.0/24") == ["10.1.2.0/24"]
    assert denied_part("10.1.2.0/24", ("10.1.0.0/16",)) == []
    assert denied_part("10.0.0.0/8", ("10.1.0.0/16",)) != []
    assert denied_part("198.18.0.0/15") == []
    with pytest.raises(ValueError, match=r"'169\.254\.169\.254'"):
        NetworkPolicy(allow_out=("pypi.org", "169.254.169.254")).check_allow_out()
    NetworkPolicy(allow_out=("10.1.2.3",)).check_allow_out(("10.1.0.0/16",))
    NetworkPolicy(allow_out=("pypi.org", "203.0.113.0/24"), deny_out=("10.0.0.0/8",)) \
        .check_allow_out()
    with pytest.raises(ValueError):
        NetworkManager(Path("/nonexistent"), operator_allow=("example.com",))


@pytest.fixture
async def dns_runtime(internet_host: str, host_config: HostConfig) -> AsyncIterator[HostRuntime]:
    """A runtime whose guests' DNS goes to a stub resolver in the test internet namespace."""
    stub = subprocess.Popen(["ip", "netns", "exec", INET_NS, sys.executable,
                             str(Path(__file__).with_name("dns_stub.py")), INET_IP,
                             "files.pandastack.test", INET_IP],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = owned_tmpdir("psd-")
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
