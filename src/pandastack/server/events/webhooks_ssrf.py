"""Where a webhook may POST: its host name resolved here, and every address it resolves to
on the public internet, not this host's own. A delivery connects to the address checked
(the URL's host name stays in the Host header and TLS's SNI), so a name that resolves to a
public address when checked and to 127.0.0.1 a moment later (DNS rebinding) gets nothing.
A refusal names the URL's host, never what the name resolved to: that would tell a tenant how
this server's resolver and /etc/hosts see names."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from pandastack.hostport.addresses import IPAddress, own_addresses, refusal

from .webhooks_dns import LookupRefused, Resolver, ThreadResolver

# The address rules are shared with registry hosts (hostport/addresses.py); these names stay.
__all__ = ["IPAddress", "Target", "TargetRefused", "check_target", "own_addresses", "parse_url",
           "refusal", "system_resolve"]

#: What every refusal says after the host: the same whichever rule refused, so the answer
#: tells nothing about the address behind a name.
_NOT_PUBLIC = ("is not a public address, or resolves to one that is not (loopback, private, "
               "link-local, CGNAT, multicast, metadata, reserved, IPv4 carried in IPv6, or "
               "this host's own)")


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
