"""Which registry hosts a tenant may have us pull from: those whose every address is public
(hostport/addresses.py, the rules a webhook's target keeps to), so that a `FROM
10.0.0.5:5000/x` or a name resolving to 127.0.0.1 does not reach the private network behind
a host. The operator's own registries are exempt: those listed in
PANDASTACK_INSECURE_REGISTRIES and the mirrors of PANDASTACK_REGISTRY_MIRRORS (a local
registry is how both are used, and how the tests reach theirs on loopback).

A refusal names the host as the tenant wrote it, never what it resolved to (that would tell
a tenant how this host's resolver sees names). Checked before each connection, redirects
and token services included."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable

from pandastack.host.images.oci.errors import ImageInvalid, RegistryUnavailable
from pandastack.host.images.oci.settings import RegistrySettings
from pandastack.hostport.addresses import refusal

# host, port -> the addresses it resolves to (the system resolver unless a test gives one)
Resolve = Callable[[str, int], list[str]]
_NOT_PUBLIC = ("is not a public address, or resolves to one that is not (loopback, private, "
               "link-local, site-local, CGNAT, multicast, metadata, reserved, or this host's "
               "own); an operator may list it in PANDASTACK_INSECURE_REGISTRIES")


class RegistryRefused(ImageInvalid):
    """The registry's host may not be connected to for a tenant."""


def system_resolve(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def split_host_port(netloc: str, default_port: int) -> tuple[str, int]:
    """(host, port) of `host[:port]` or `[v6]:port`, as a URL's netloc writes them."""
    if netloc.startswith("["):
        host, _, rest = netloc[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = netloc.rpartition(":") if netloc.count(":") == 1 else (netloc, "", "")
    return host, int(port) if port.isdigit() else default_port


def operators(settings: RegistrySettings, netloc: str) -> bool:
    """Whether `netloc` is one of the operator's registries (insecure list or a mirror)."""
    return netloc in settings.insecure or netloc in settings.mirrors.values()


def check_host(image: str, netloc: str, settings: RegistrySettings, *, https: bool,
               resolve: Resolve = system_resolve) -> None:
    """Raise RegistryRefused unless `netloc` is the operator's or all its addresses public."""
    if operators(settings, netloc):
        return
    host, port = split_host_port(netloc, 443 if https else 80)
    try:
        addresses = [str(ipaddress.ip_address(host))]
    except ValueError:
        try:
            addresses = resolve(host, port)
        except (OSError, UnicodeError):
            raise RegistryUnavailable(image, f"registry host {host} does not resolve") from None
    if not addresses:
        raise RegistryUnavailable(image, f"registry host {host} does not resolve")
    if any(refusal(address, False, ()) is not None for address in addresses):
        raise RegistryRefused(image, f"registry host {host} {_NOT_PUBLIC}")
