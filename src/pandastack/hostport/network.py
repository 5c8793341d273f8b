"""The egress policy of a sandbox as the host port carries it, and the rules that judge it
before anything is applied: which entries are CIDRs or domain names, and which ranges no
policy opens (ALWAYS_DENIED, less the operator's list). The control plane checks a request
with these; the host's nftables and egress proxy enforce the same rules (host/network/)."""

from __future__ import annotations

import functools
import ipaddress
import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MAX_NAME = 253
_LABEL = re.compile(r"[a-z0-9_-]{1,63}")

# Private, loopback, link-local (cloud metadata), CGNAT, multicast and reserved ranges: never
# reachable from a guest, but for the parts the operator lists that a policy then allows.
ALWAYS_DENIED = (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
    "172.16.0.0/12", "192.0.0.0/24", "192.168.0.0/16", "224.0.0.0/4", "240.0.0.0/4",
)
OPERATOR_ALLOW_VAR = "PANDASTACK_NETWORK_OPERATOR_ALLOW"


def normalize_name(raw: str) -> str | None:
    """`raw` as a lower-case DNS name without the trailing dot, or None if it is not one.

    ASCII only (an IDN arrives as its xn-- form). Strings that the C library's resolver would
    read as an address ("1.2.3", "0x7f000001", "017.0.0.1") are not names: they would turn a
    name check into an address the check never saw.
    """
    name = raw.lower()
    if name.endswith("."):
        name = name[:-1]
    if not name or len(name) > MAX_NAME or not name.isascii():
        return None
    labels = name.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels) or labels[-1].isdigit():
        return None
    try:
        socket.inet_aton(name)
    except OSError:
        return name
    return None


def parse_domain_entry(entry: str) -> str | None:
    """A policy's domain entry, normalized: "example.com" (that name only), "*.example.com"
    (names below it, not itself) or ".example.com" (itself and names below); else None."""
    for prefix in ("*.", "."):
        if entry.startswith(prefix):
            rest = normalize_name(entry[len(prefix):])
            return None if rest is None else prefix + rest
    return normalize_name(entry)


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
