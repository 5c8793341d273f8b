"""Per-sandbox networking: a network namespace per sandbox, enforced from outside the guest.

Every guest has the same address and MAC (169.254.0.21 behind a tap named `tap0`), baked into
the template, so restores and forks need no guest reconfiguration. What differs is the slot
the VM's namespace gets: a /30 out of a host pool (default 10.200.0.0/16, 16,384 slots) on a
veth pair to the host. Inside the namespace nftables drops what the guest sends from any
other address than its own, translates the guest address to the slot address, applies the
egress policy, and lets in only replies and connections the host itself opens (the port
proxy); on the host one table stops sandboxes from reaching the host itself or each other
(but for the egress proxy's two ports), stops anything outside from opening a connection
into a sandbox, and masquerades their traffic to the outside. Domain entries of a policy are
not turned into addresses: the namespace sends the guest's TCP to ports 80 and 443 to the
egress proxy on the host, which decides by the name in the connection (egress_proxy.py).

The always-denied ranges (ALWAYS_DENIED) are closed whatever the policy says, before any
`allow_out` entry is looked at, except the parts the operator lists (`operator_allow`,
PANDASTACK_NETWORK_OPERATOR_ALLOW): only those a policy's `allow_out` CIDRs can open.

Slots are claimed by creating `claims/<index>` with O_EXCL (atomic, survives restarts). A
claim records its owner's directory, so a sweep can release the claims, and delete the
namespaces, of sandboxes that no longer exist. Slot indexes, namespace and veth names,
addresses and the host table belong to the network namespace the runtime runs in, so every
runtime there must claim in one claims dir from one pool, whatever its PANDASTACK_HOME
(ADR 0021): the first to touch the namespace's network records both under /run, and one
with another claims dir or pool refuses to build, update or sweep anything while the
recorded dir holds claims.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import random
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pandastack.hostport.errors import HostError
from pandastack.hostport.network import (
    ALWAYS_DENIED,
    NetworkPolicy,
    hard_denied,
    parse_cidrs,
)

GUEST_IP = "169.254.0.21"
GATEWAY_IP = "169.254.0.22"
GUEST_MAC = "02:70:73:00:00:21"
TAP = "tap0"
NS_VETH = "eth0"
NS_PREFIX = "psn-"
HOST_VETH_PREFIX = "psv"
DEFAULT_POOL = "10.200.0.0/16"
HOST_TABLE = "pandastack_host"
# Which claims dir and pool each network namespace's runtimes use (tmpfs: namespaces do not
# outlive a boot either).
NETNS_REGISTRY = Path("/run/pandastack-network")


class NetworkError(HostError):
    pass


@dataclass(frozen=True)
class ProxyPorts:
    """Host ports of the egress proxy (egress_proxy.py), the same for every runtime on the
    host: the host table admits exactly these from sandbox slots."""

    http: int = 15080
    tls: int = 15443


@dataclass(frozen=True)
class Slot:
    index: int
    pool: str

    @property
    def netns(self) -> str:
        return f"{NS_PREFIX}{self.index}"

    @property
    def host_veth(self) -> str:
        return f"{HOST_VETH_PREFIX}{self.index}"

    def _addr(self, offset: int) -> str:
        base = ipaddress.ip_network(self.pool).network_address
        return str(base + 4 * self.index + offset)

    @property
    def host_ip(self) -> str:
        return self._addr(1)

    @property
    def ns_ip(self) -> str:
        return self._addr(2)

    @property
    def netns_path(self) -> str:
        return f"/run/netns/{self.netns}"


def host_resolver() -> str | None:
    """The host's first IPv4 nameserver that a namespace can reach (not loopback)."""
    try:
        lines = Path("/etc/resolv.conf").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            try:
                addr = ipaddress.ip_address(parts[1])
            except ValueError:
                continue
            if addr.version == 4 and not addr.is_loopback:
                return str(addr)
    return None


@dataclass
class NetworkManager:
    """Claims slots, builds and removes namespaces, writes nftables rules.

    `dns_upstream` is where guests' DNS queries (to their gateway) are forwarded, or None for
    no DNS at all. DNS is only open to a sandbox that may reach something outside (internet
    on, or an allow list), since it is a channel out. `proxy_ports`: where a policy with
    domain entries sends the guest's TCP to ports 80 and 443 (the slot's host address).
    `operator_allow`: the CIDRs of the always-denied ranges that policies may open.
    """

    claims_dir: Path
    pool: str = DEFAULT_POOL
    dns_upstream: str | None = None
    proxy_ports: ProxyPorts = ProxyPorts()
    operator_allow: tuple[str, ...] = ()
    registry: Path = NETNS_REGISTRY
    _host_ready: bool = field(default=False, init=False)
    _bound: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.operator_allow = parse_cidrs(self.operator_allow)

    @property
    def capacity(self) -> int:
        return ipaddress.ip_network(self.pool).num_addresses // 4

    # -- claims -----------------------------------------------------------------------

    def claim(self, owner: Path) -> Slot:
        """Claim a free slot for `owner` (a sandbox directory). Expected O(1): random probes
        into a mostly free pool, then a scan only when it is nearly full."""
        self.claims_dir.mkdir(parents=True, exist_ok=True)
        capacity = self.capacity
        probes = [random.randrange(capacity) for _ in range(32)]
        # The claim appears with its content in one step (link of a written file), so a
        # concurrent sweep never sees an empty claim and mistakes it for an orphan.
        draft = self._draft(owner)
        try:
            for index in [*probes, *range(capacity)]:
                try:
                    os.link(draft, self.claims_dir / str(index))
                except FileExistsError:
                    continue
                return Slot(index, self.pool)
        finally:
            draft.unlink(missing_ok=True)
        raise NetworkError(f"no free network slot in {self.pool}")

    def reassign(self, slot: Slot, owner: Path) -> None:
        draft = self._draft(owner)
        os.replace(draft, self.claims_dir / str(slot.index))

    def _draft(self, owner: Path) -> Path:
        draft = self.claims_dir / f".draft-{os.getpid()}-{random.getrandbits(48):x}"
        draft.write_text(json.dumps({"owner": str(owner), "pool": self.pool}))
        return draft

    def release(self, slot: Slot) -> None:
        (self.claims_dir / str(slot.index)).unlink(missing_ok=True)

    def claims(self) -> dict[int, Path]:
        found: dict[int, Path] = {}
        for entry in self.claims_dir.glob("*") if self.claims_dir.exists() else []:
            if not entry.name.isdigit():
                continue
            try:
                found[int(entry.name)] = Path(json.loads(entry.read_text())["owner"])
            except (OSError, ValueError, KeyError):
                found[int(entry.name)] = Path("/nonexistent")
        return found

    def sweep(self) -> list[int]:
        """Release claims (and namespaces) whose owner directory is gone; drop namespaces
        that nobody claims. Returns the released slot indexes."""
        self.bind_namespace()
        released = []
        claimed = self.claims()
        for index, owner in claimed.items():
            if not owner.exists():
                self.teardown(Slot(index, self.pool))
                self.release(Slot(index, self.pool))
                released.append(index)
        for name in list_netns():
            suffix = name[len(NS_PREFIX):]
            if not (name.startswith(NS_PREFIX) and suffix.isdigit()):
                continue
            # Another runtime may have claimed it since we listed the claims: a namespace is
            # only built after its claim exists, so a claim present now means it is in use.
            if int(suffix) not in claimed and not (self.claims_dir / suffix).exists():
                _run(["ip", "netns", "del", name], check=False)
        return released

    # -- the network namespace's one claims dir ------------------------------------------

    def bind_namespace(self) -> None:
        """Record this manager's claims dir and pool as the ones of the network namespace it
        runs in, or raise NetworkError if another runtime there uses others and still holds
        claims: its sweep would delete this one's namespaces (and this one theirs), and their
        slots would share names and addresses."""
        if self._bound:
            return
        mine = {"claims": str(self.claims_dir.resolve()), "pool": self.pool}
        marker = self.registry / f"netns-{netns_id()}.json"
        with self._registry_lock():
            try:
                theirs = json.loads(marker.read_text())
            except (OSError, ValueError):
                theirs = None
            if isinstance(theirs, dict) and theirs != mine:
                other = Path(str(theirs.get("claims", "")))
                if _holds_claims(other):
                    raise NetworkError(
                        f"another runtime in this network namespace claims slots in {other} "
                        f"from pool {theirs.get('pool')}; this one would use {mine['claims']} "
                        f"from {self.pool}: runtimes sharing a network namespace must share "
                        "both (PANDASTACK_NETWORK_CLAIMS, PANDASTACK_NETWORK_POOL), or run in "
                        "network namespaces of their own")
            if theirs != mine:
                draft = marker.with_suffix(f".{os.getpid()}.tmp")
                draft.write_text(json.dumps(mine))
                os.replace(draft, marker)
        self._bound = True

    @contextlib.contextmanager
    def _registry_lock(self) -> Iterator[None]:
        self.registry.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(self.registry / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    # -- namespaces -------------------------------------------------------------------

    def ensure_host(self) -> None:
        """Forwarding on, and the host table that fences sandboxes off (idempotent)."""
        if self._host_ready:
            return
        self.bind_namespace()
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
        veths = f'"{HOST_VETH_PREFIX}*"'
        ports = f"{self.proxy_ports.http}, {self.proxy_ports.tls}"
        # Into a sandbox, only replies and connections of the runtime's own user (the port
        # proxy) pass: not a neighbour or container routing to the pool, nor another user.
        # Out of one, only its slot address (the namespace drops the rest; this is the
        # second fence). The table is host-wide: the last runtime to write it names the user.
        ruleset = f"""
table inet {HOST_TABLE}
delete table inet {HOST_TABLE}
table inet {HOST_TABLE} {{
    chain input {{
        type filter hook input priority -10; policy accept;
        iifname {veths} ct state established,related accept
        iifname {veths} ip saddr {self.pool} ip daddr {self.pool} tcp dport {{ {ports} }} accept
        iifname {veths} drop
    }}
    chain forward {{
        type filter hook forward priority -10; policy accept;
        iifname {veths} oifname {veths} drop
        iifname {veths} ip saddr != {self.pool} drop
        iifname {veths} meta nfproto ipv6 drop
        oifname {veths} ct state established,related accept
        oifname {veths} drop
    }}
    chain output {{
        type filter hook output priority -10; policy accept;
        oifname {veths} ct state new meta skuid != {os.geteuid()} drop
    }}
    chain postrouting {{
        type nat hook postrouting priority 100; policy accept;
        ip saddr {self.pool} oifname != {veths} masquerade
    }}
}}
"""
        _run(["nft", "-f", "-"], stdin=ruleset)
        self._host_ready = True

    def setup(self, slot: Slot, policy: NetworkPolicy) -> None:
        self.ensure_host()
        policy.cidrs()  # a bad entry fails before anything is built
        ns = slot.netns
        outside = [
            f"netns add {ns}",
            f"link add {slot.host_veth} type veth peer name {NS_VETH} netns {ns}",
            f"addr add {slot.host_ip}/30 dev {slot.host_veth}",
            f"link set {slot.host_veth} up",
        ]
        inside = [
            "link set lo up",
            f"addr add {slot.ns_ip}/30 dev {NS_VETH}",
            f"link set {NS_VETH} up",
            f"route add default via {slot.host_ip}",
            f"tuntap add {TAP} mode tap",
            f"addr add {GATEWAY_IP}/30 dev {TAP}",
            f"link set {TAP} up",
        ]
        try:
            _run(["ip", "-batch", "-"], stdin="\n".join(outside) + "\n")
            _run(["ip", "-n", ns, "-batch", "-"], stdin="\n".join(inside) + "\n")
            self._apply(slot, policy, first=True)
        except NetworkError:
            self.teardown(slot)
            raise

    def update(self, slot: Slot, policy: NetworkPolicy) -> None:
        self.ensure_host()  # after a restart: the proxy ports may have changed
        self._apply(slot, policy, first=False)

    def _apply(self, slot: Slot, policy: NetworkPolicy, *, first: bool) -> None:
        def elements(nets: Sequence[str]) -> str:
            return f"elements = {{ {', '.join(nets)} }}" if nets else ""

        internet = policy.internet
        allow, deny = policy.cidrs()
        verdict = "accept" if internet else "drop"
        denied = ", ".join(ALWAYS_DENIED)
        hard = [str(net) for net in hard_denied(self.operator_allow)]
        # New connections into the guest: only those the host opens to the slot address.
        from_host = f'iifname "{NS_VETH}" oifname "{TAP}" ip saddr {slot.host_ip}'
        proxy_nat = proxy_forward = proxy_quic = ""
        if policy.needs_proxy:
            # Addresses allowed by CIDR keep their direct path; everything else on 80/443 is
            # decided by name, by the proxy, which never uses the address the guest dialled.
            ports = self.proxy_ports
            proxy_nat = "\n".join(
                f'        iifname "{TAP}" ip daddr != @allow_out tcp dport {dport} '
                f"dnat ip to {slot.host_ip}:{port}"
                for dport, port in ((80, ports.http), (443, ports.tls)))
            proxy_forward = (
                f'        iifname "{TAP}" oifname "{NS_VETH}" ip daddr {slot.host_ip} '
                f"tcp dport {{ {ports.http}, {ports.tls} }} ct status dnat accept")
            # QUIC carries its name where the proxy cannot see it: without it, clients fall
            # back to TCP 443, which the proxy judges.
            proxy_quic = f'        iifname "{TAP}" oifname "{NS_VETH}" udp dport 443 drop'
        dns_nat = dns_forward = ""
        if self.dns_upstream and (internet or allow):
            up = self.dns_upstream
            dns_nat = "\n".join(
                f'        iifname "{TAP}" ip daddr {GATEWAY_IP} {proto} dport 53 '
                f"dnat ip to {up}:53" for proto in ("udp", "tcp"))
            dns_forward = "\n".join(
                f'        iifname "{TAP}" oifname "{NS_VETH}" ip daddr {up} {proto} dport 53 accept'
                for proto in ("udp", "tcp"))
        ruleset = f"""
table inet pandastack
delete table inet pandastack
table inet pandastack {{
    set allow_out {{ type ipv4_addr; flags interval; auto-merge; {elements(allow)} }}
    set deny_out {{ type ipv4_addr; flags interval; auto-merge; {elements(deny)} }}
    set always_denied {{ type ipv4_addr; flags interval; elements = {{ {denied} }} }}
    set hard_denied {{ type ipv4_addr; flags interval; {elements(hard)} }}
    chain guard {{
        type filter hook prerouting priority -300; policy accept;
        iifname "{TAP}" ip saddr != {GUEST_IP} drop
        iifname "{TAP}" meta nfproto ipv6 drop
    }}
    chain input {{
        type filter hook input priority 0; policy drop;
        iifname "lo" accept
        ct state established,related accept
    }}
    chain forward {{
        type filter hook forward priority 0; policy drop;
        ct state established,related accept
{dns_forward}
{proxy_forward}
        iifname "{TAP}" oifname "{NS_VETH}" ip daddr {self.pool} drop
        iifname "{TAP}" oifname "{NS_VETH}" ip daddr @hard_denied drop
        iifname "{TAP}" oifname "{NS_VETH}" ip daddr @allow_out accept
{proxy_quic}
        iifname "{TAP}" oifname "{NS_VETH}" ip daddr @deny_out drop
        iifname "{TAP}" oifname "{NS_VETH}" ip daddr @always_denied drop
        iifname "{TAP}" oifname "{NS_VETH}" {verdict}
        {from_host} ip daddr {GUEST_IP} ct status dnat accept
    }}
    chain prerouting {{
        type nat hook prerouting priority -100; policy accept;
        iifname "{NS_VETH}" ip daddr {slot.ns_ip} dnat ip to {GUEST_IP}
{dns_nat}
{proxy_nat}
    }}
    chain postrouting {{
        type nat hook postrouting priority 100; policy accept;
        oifname "{NS_VETH}" ip saddr {GUEST_IP} snat ip to {slot.ns_ip}
    }}
}}
"""
        script = "nft -f - && echo 1 > /proc/sys/net/ipv4/ip_forward" if first else "nft -f -"
        _run(["ip", "netns", "exec", slot.netns, "sh", "-c", script], stdin=ruleset)

    def teardown(self, slot: Slot) -> None:
        """Remove the namespace (with it the veth pair, the tap and the nft tables)."""
        if slot.netns in list_netns():
            _run(["ip", "netns", "del", slot.netns], check=False)
        if Path(f"/sys/class/net/{slot.host_veth}").exists():
            _run(["ip", "link", "del", slot.host_veth], check=False)


def netns_id() -> str:
    """The network namespace this process is in (device and inode of its handle)."""
    st = os.stat("/proc/self/ns/net")
    return f"{st.st_dev}-{st.st_ino}"


def _holds_claims(claims_dir: Path) -> bool:
    try:
        return any(entry.name.isdigit() for entry in claims_dir.iterdir())
    except OSError:
        return False


def list_netns() -> list[str]:
    try:
        return sorted(os.listdir("/run/netns"))
    except FileNotFoundError:
        return []


def _run(argv: list[str], *, stdin: str | None = None, check: bool = True) -> str:
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise NetworkError(f"{' '.join(argv[:4])}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout
