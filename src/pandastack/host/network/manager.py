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

Slots are claimed host-wide by creating `claims/<index>` with O_EXCL (atomic, survives
restarts, shared by every runtime on the machine). A claim records its owner's directory, so a
sweep can release the claims, and delete the namespaces, of sandboxes that no longer exist.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import random
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pandastack.host.errors import HostError
from pandastack.host.network.egress_wire import parse_domain_entry

GUEST_IP = "169.254.0.21"
GATEWAY_IP = "169.254.0.22"
GUEST_MAC = "02:70:73:00:00:21"
TAP = "tap0"
NS_VETH = "eth0"
NS_PREFIX = "psn-"
HOST_VETH_PREFIX = "psv"
DEFAULT_POOL = "10.200.0.0/16"
HOST_TABLE = "pandastack_host"
# Private, loopback, link-local (cloud metadata), CGNAT, multicast and reserved ranges: never
# reachable from a guest, but for the parts the operator lists that a policy then allows.
ALWAYS_DENIED = (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
    "172.16.0.0/12", "192.0.0.0/24", "192.168.0.0/16", "224.0.0.0/4", "240.0.0.0/4",
)
OPERATOR_ALLOW_VAR = "PANDASTACK_NETWORK_OPERATOR_ALLOW"


class NetworkError(HostError):
    pass


@dataclass(frozen=True)
class ProxyPorts:
    """Host ports of the egress proxy (egress_proxy.py), the same for every runtime on the
    host: the host table admits exactly these from sandbox slots."""

    http: int = 15080
    tls: int = 15443


def parse_cidrs(entries: Iterable[str]) -> tuple[str, ...]:
    """IPv4 networks in their canonical form ("10.1.2.3" -> "10.1.2.3/32"); ValueError
    naming the first entry that is none."""
    nets = []
    for entry in entries:
        try:
            net = ipaddress.ip_network(entry.strip(), strict=False)
        except ValueError:
            raise ValueError(f"not an IPv4 CIDR: {entry!r}") from None
        if net.version != 4:
            raise ValueError(f"not an IPv4 CIDR: {entry!r}")
        nets.append(str(net))
    return tuple(nets)


def operator_allow_from(env: Mapping[str, str]) -> tuple[str, ...]:
    """The operator's list from the environment (comma-separated CIDRs), canonical;
    ValueError naming the variable and the entry when one is not a CIDR."""
    entries = [e for e in env.get(OPERATOR_ALLOW_VAR, "").split(",") if e.strip()]
    try:
        return parse_cidrs(entries)
    except ValueError as exc:
        raise ValueError(f"{OPERATOR_ALLOW_VAR}: {exc}") from None


@functools.lru_cache(maxsize=16)
def hard_denied(operator_allow: tuple[str, ...] = ()) -> tuple[ipaddress.IPv4Network, ...]:
    """ALWAYS_DENIED less the operator's list: what no policy opens."""
    nets = [ipaddress.IPv4Network(n) for n in ALWAYS_DENIED]
    for hole in (ipaddress.IPv4Network(n) for n in operator_allow):
        kept: list[ipaddress.IPv4Network] = []
        for net in nets:
            if not net.overlaps(hole):
                kept.append(net)
            elif not hole.supernet_of(net):  # two CIDRs that overlap: one holds the other
                kept.extend(net.address_exclude(hole))
        nets = kept
    return tuple(ipaddress.collapse_addresses(nets))


def denied_part(cidr: str, operator_allow: tuple[str, ...] = ()) -> list[str]:
    """The parts of `cidr` that no policy opens (empty when it lies outside them all)."""
    net = ipaddress.IPv4Network(cidr, strict=False)
    return [str(net if denied.supernet_of(net) else denied)
            for denied in hard_denied(operator_allow) if net.overlaps(denied)]


@dataclass(frozen=True)
class NetworkPolicy:
    """Egress rules. Entries are IPv4 CIDRs (enforced by nftables in the namespace) or domain
    names: "example.com", "*.example.com" (names below it) or ".example.com" (both), enforced
    by the host's egress proxy on ports 80 and 443 by the TLS SNI or HTTP Host the guest sends
    (see egress_proxy.py). `allow_out` wins over `deny_out` and `internet: false`; it never
    opens the always-denied ranges but for the parts the operator lists (`hard_denied`)."""

    internet: bool = True
    allow_out: tuple[str, ...] = ()
    deny_out: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, object] | None) -> NetworkPolicy:
        data = data or {}
        unknown = set(data) - {"internet", "allow_out", "deny_out"}
        if unknown:
            raise ValueError(f"unknown network fields: {sorted(unknown)}")
        internet = data.get("internet", True)
        if not isinstance(internet, bool):
            raise ValueError("network.internet must be true or false")
        lists = {}
        for key in ("allow_out", "deny_out"):
            value = data.get(key, [])
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"network.{key} must be a list of CIDRs or domain names")
            if len(value) > 256:
                raise ValueError(f"network.{key} has more than 256 entries")
            lists[key] = tuple(str(v) for v in value)
        policy = cls(internet, lists["allow_out"], lists["deny_out"])
        policy.cidrs()  # fail early on entries that are neither CIDRs nor names
        return policy

    def to_dict(self) -> dict[str, object]:
        return {"internet": self.internet, "allow_out": list(self.allow_out),
                "deny_out": list(self.deny_out)}

    def check_allow_out(self, operator_allow: tuple[str, ...] = ()) -> None:
        """Refuse (ValueError naming it) an `allow_out` CIDR that reaches into the
        always-denied ranges outside the operator's list: it would not open them anyway."""
        for entry in self.allow_out:
            try:
                net = ipaddress.ip_network(entry, strict=False)
            except ValueError:
                continue  # a domain entry: its addresses are judged per connection
            denied = denied_part(str(net), operator_allow)
            if denied:
                shown = ", ".join(denied[:4]) + (", ..." if len(denied) > 4 else "")
                raise ValueError(
                    f"network.allow_out entry {entry!r} reaches always-denied addresses "
                    f"({shown}: private, loopback, link-local/cloud metadata, CGNAT, "
                    f"multicast or reserved), which only the server's operator can open "
                    f"({OPERATOR_ALLOW_VAR}); for the public internet use \"internet\": true")

    def cidrs(self) -> tuple[list[str], list[str]]:
        """The CIDR entries of allow_out and deny_out (raises ValueError on a bad entry)."""
        return _split(self.allow_out)[0], _split(self.deny_out)[0]

    def domains(self) -> tuple[list[str], list[str]]:
        """The normalized domain entries of allow_out and deny_out."""
        return _split(self.allow_out)[1], _split(self.deny_out)[1]

    @property
    def needs_proxy(self) -> bool:
        """Whether ports 80/443 go through the egress proxy: allowed names matter only with
        the internet off, denied names only with it on (otherwise every name already is)."""
        allow, deny = self.domains()
        return bool(deny) if self.internet else bool(allow)


def _split(entries: Iterable[str]) -> tuple[list[str], list[str]]:
    nets: list[str] = []
    names: list[str] = []
    for entry in entries:
        try:
            net = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            name = parse_domain_entry(entry)
            if name is None:
                raise ValueError(f"not a CIDR or a domain name: {entry!r}") from None
            names.append(name)
            continue
        if net.version != 4:
            raise ValueError(f"only IPv4 networks are supported: {entry}")
        nets.append(str(net))
    return nets, names


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
    _host_ready: bool = field(default=False, init=False)

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

    # -- namespaces -------------------------------------------------------------------

    def ensure_host(self) -> None:
        """Forwarding on, and the host table that fences sandboxes off (idempotent)."""
        if self._host_ready:
            return
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
