"""Which addresses are public: on the internet and not this host's own. What a tenant names
for the control plane or a host to connect to (a webhook's target, a registry a template is
built from) must resolve to public addresses only, unless the operator says otherwise: the
private network behind a server is not the tenant's to reach."""

from __future__ import annotations

import ipaddress
import itertools
import time
from collections.abc import Sequence
from pathlib import Path

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Refused whatever `is_global` says (Python's table calls several of these global):
#: metadata services, multicast; the IPv6 forms that carry an IPv4 address to wherever a
#: translator or an old stack sends it (IPv4-compatible ::a.b.c.d, IPv4-translated
#: ::ffff:0:a.b.c.d, NAT64's well-known and local-use prefixes), and deprecated site-local
#: fec0::/10, which some networks still route internally. IPv4-mapped and 6to4 addresses
#: are unwrapped below and their IPv4 address checked.
ALWAYS_REFUSED = tuple(ipaddress.ip_network(n) for n in (
    "0.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "224.0.0.0/4", "240.0.0.0/4",
    "255.255.255.255/32", "::/96", "::ffff:0:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48",
    "fe80::/10", "fec0::/10", "fc00::/7", "ff00::/8", "fd00:ec2::254/128"))
_OWN_TTL = 60.0


def _unwrap(ip: IPAddress) -> IPAddress:
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.sixtofour is not None:
            return ip.sixtofour
    return ip


_own_cache: tuple[float, frozenset[IPAddress]] = (0.0, frozenset())


def own_addresses() -> frozenset[IPAddress]:
    """The addresses of this host's interfaces (a public one is still this host)."""
    global _own_cache
    now = time.monotonic()
    if now - _own_cache[0] < _OWN_TTL:
        return _own_cache[1]
    found: set[IPAddress] = set()
    try:
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
        for prev, line in itertools.pairwise(lines):
            if "/32 host LOCAL" in line:
                found.add(ipaddress.IPv4Address(prev.strip().split()[-1]))
    except (OSError, ValueError):
        pass
    try:
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            raw = line.split()[0]
            found.add(ipaddress.IPv6Address(":".join(raw[i:i + 4] for i in range(0, 32, 4))))
    except (OSError, ValueError, IndexError):
        pass
    _own_cache = (now, frozenset(found))
    return _own_cache[1]


def refusal(address: str, allow_private: bool,
            allow: Sequence[Network]) -> str | None:
    """Why `address` may not be connected to for a tenant (None: it may). For logs and
    tests only: a tenant is told one answer whichever reason it was (it would tell how this
    server sees names)."""
    try:
        raw = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return f"{address!r} is not an IP address"
    ip = _unwrap(raw)
    if allow_private or any(a in net for net in allow for a in {raw, ip}
                            if net.version == a.version):
        return None
    if ip in own_addresses():
        return f"{ip} is an address of this host"
    if not ip.is_global or any(a in net for net in ALWAYS_REFUSED for a in {raw, ip}
                               if net.version == a.version):
        return f"{ip} is not a public address"
    return None
