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
import ssl
from collections.abc import Callable, Iterable

import httpcore
import httpx
from httpcore import NetworkStream
from httpcore._backends.base import SOCKET_OPTION

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
               resolve: Resolve = system_resolve) -> list[str] | None:
    """Raise RegistryRefused unless `netloc` is the operator's or all its addresses public;
    the addresses checked (None for the operator's: resolved as usual when connecting)."""
    if operators(settings, netloc):
        return None
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
    return addresses


class PinnedBackend(httpcore.SyncBackend):
    """Opens each connection to an address it has just checked, resolving the name once,
    here: a name whose answer changes between a check and the connection (DNS rebinding)
    cannot slip a private address in. TLS still verifies the certificate for the name
    (httpcore hands the URL's host to the handshake, not the address connected to)."""

    def __init__(self, image: str, settings: RegistrySettings, resolve: Resolve) -> None:
        self._image = image
        self._settings = settings
        self._resolve = resolve

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: Iterable[SOCKET_OPTION] | None = None) -> NetworkStream:
        bare = host.strip("[]")
        netloc = f"[{bare}]:{port}" if ":" in bare else f"{bare}:{port}"
        if operators(self._settings, netloc) or operators(self._settings, host):
            return super().connect_tcp(host, port, timeout, local_address, socket_options)
        addresses = check_host(self._image, netloc, self._settings, https=port == 443,
                               resolve=self._resolve)
        assert addresses  # not the operator's: checked addresses, at least one
        return super().connect_tcp(addresses[0], port, timeout, local_address, socket_options)


def pinned_transport(image: str, settings: RegistrySettings,
                     verify: ssl.SSLContext | bool,
                     resolve: Resolve = system_resolve) -> httpx.HTTPTransport:
    """httpx's transport, its connections opened by PinnedBackend. httpx takes no network
    backend, so it is set on the pool it made (test_hosts fails if that attribute moves)."""
    transport = httpx.HTTPTransport(verify=verify, trust_env=False)
    pool = transport._pool
    assert isinstance(pool, httpcore.ConnectionPool)
    pool._network_backend = PinnedBackend(image, settings, resolve)
    return transport
