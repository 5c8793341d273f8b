"""Where a webhook may POST: its host name resolved here, and every address it resolves to
on the public internet, not this host's own. A delivery connects to the address checked
(the URL's host name stays in the Host header and TLS's SNI), so a name that resolves to a
public address when checked and to 127.0.0.1 a moment later (DNS rebinding) gets nothing.
A refusal names the URL's host, never what the name resolved to: that would tell a tenant how
this server's resolver and /etc/hosts see names."""

from __future__ import annotations

import ipaddress
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from .webhooks_dns import LookupRefused, Resolver, ThreadResolver

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Refused whatever `is_global` says (Python's table calls several of these global):
#: metadata services, multicast; the IPv6 forms that carry an IPv4 address to wherever a
#: translator or an old stack sends it (IPv4-compatible ::a.b.c.d, IPv4-translated
#: ::ffff:0:a.b.c.d, NAT64's well-known and local-use prefixes), and deprecated site-local
#: fec0::/10, which some networks still route internally. IPv4-mapped and 6to4 addresses
#: are unwrapped below and their IPv4 address checked.
_ALWAYS = tuple(ipaddress.ip_network(n) for n in (
    "0.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "224.0.0.0/4", "240.0.0.0/4",
    "255.255.255.255/32", "::/96", "::ffff:0:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48",
    "fe80::/10", "fec0::/10", "fc00::/7", "ff00::/8", "fd00:ec2::254/128"))
#: What every refusal says after the host: the same whichever rule refused, so the answer
#: tells nothing about the address behind a name.
_NOT_PUBLIC = ("is not a public address, or resolves to one that is not (loopback, private, "
               "link-local, CGNAT, multicast, metadata, reserved, IPv4 carried in IPv6, or "
               "this host's own)")
_OWN_TTL = 60.0


class TargetRefused(ValueError):
    """The URL may not be a webhook's target; the message says why."""


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # as in the URL
    port: int
    address: str  # the checked address a delivery connects to
    path: str  # path and query


#: The system resolver, off the default executor (server/events/webhooks_dns.py).
system_resolve: Resolver = ThreadResolver()


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
            allow: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> str | None:
    """Why a webhook may not connect to `address` (None: it may). For logs and tests only:
    a tenant is told `_NOT_PUBLIC`, whichever reason it was."""
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
    if not ip.is_global or any(a in net for net in _ALWAYS for a in {raw, ip}
                               if net.version == a.version):
        return f"{ip} is not a public address"
    return None


def parse_url(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path?query) of an http(s) URL without credentials."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetRefused("url must be http:// or https:// with a host")
    if parts.username or parts.password:
        raise TargetRefused("url must not carry credentials")
    if parts.fragment:
        raise TargetRefused("url must not have a #fragment")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise TargetRefused("url has a bad port") from None
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.scheme, parts.hostname, port, path


async def check_target(url: str, *, allow_private: bool,
                       allow: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network],
                       resolve: Resolver = system_resolve) -> Target:
    """The checked target of `url`, or TargetRefused. Every address the name resolves to
    must pass: a name with one private address among public ones is refused."""
    scheme, host, port, path = parse_url(url)
    try:
        literal: IPAddress | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        addresses = [str(literal)]
    else:
        try:
            addresses = await resolve(host, port)
        except (OSError, UnicodeError) as exc:
            # The resolver's own words (NXDOMAIN or SERVFAIL, which server) stay here.
            reason = str(exc) if isinstance(exc, LookupRefused) else "it does not resolve"
            raise TargetRefused(f"{host}: {reason}") from None
    if not addresses:
        raise TargetRefused(f"{host}: it does not resolve")
    for address in addresses:
        if refusal(address, allow_private, allow) is not None:
            raise TargetRefused(f"{host} {_NOT_PUBLIC} (an operator may allow it: "
                                "PANDASTACK_WEBHOOK_ALLOW_PRIVATE or _ALLOW_CIDRS)")
    return Target(scheme, host, port, addresses[0].split("%", 1)[0], path)
