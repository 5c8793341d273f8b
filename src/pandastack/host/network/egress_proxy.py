"""Host-side egress proxy: a policy's domain entries are enforced by the name a connection
carries, not by an address.

When a sandbox's policy has domain entries, its namespace DNATs the guest's TCP to ports 80
and 443 (except to addresses the policy allows by CIDR) to this proxy on the slot's host
address (manager.py). The proxy reads the name the guest asks for (the SNI of the TLS
ClientHello on 443; the Host header of every HTTP/1.x request on 80), decides by the
sandbox's current policy, resolves the name itself, on the host, and connects to that address
on the same port. The address the guest dialled is never used: a forged DNS answer, or a raw
IP with another name, reaches the allowed name's real address or nothing.

Decision. A name passes if an `allow_out` domain entry matches it, else if no `deny_out`
domain entry matches and the internet is on (egress_wire.domain_matches: "example.com" is
that name only, "*.example.com" the names below it, ".example.com" both). Each resolved
address then never passes if it is in the slot pool, one of the host's own addresses (what
the host table fences sandboxes off from), or an always-denied range outside the operator's
list (network.hard_denied: an allowed name whose DNS answer is 169.254.169.254, 127.0.0.1
or a private address reaches nothing, whatever the policy allows); else it passes if an
`allow_out` CIDR holds it, else if no `deny_out` CIDR and no always-denied range does.
No name (no SNI, no Host) is refused.

Listeners. One pair (HTTP port, TLS port) per slot that needs it, bound to that slot's host
address by the runtime owning the sandbox. Slots are claimed host-wide, so runtimes sharing a
host never bind the same address, and the accepting listener names the slot; the peer must
also be that slot's namespace address. A slot's listeners close when its sandbox is killed or
its policy loses its domain entries, all of them when the runtime closes (cutting proxied
connections); a restarted runtime binds them again for the sandboxes it adopts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import re
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import dns.asyncresolver
import dns.exception
import dns.resolver

from pandastack.host.network.egress_wire import (
    MAX_HEAD,
    Refused,
    RequestHead,
    domain_matches,
    ipv4_literal,
    parse_chunk_line,
    parse_request_head,
    read_client_hello,
    read_request_head,
    trailer_ends,
)
from pandastack.host.network.manager import NetworkError, ProxyPorts, Slot
from pandastack.hostport.network import ALWAYS_DENIED, NetworkPolicy, hard_denied, parse_cidrs

log = logging.getLogger("pandastack.host.egress")

# A name -> its IPv4 addresses. Tests swap in a table so that no test name reaches real DNS.
Resolver = Callable[[str], Awaitable[Sequence[str]]]

FIRST_BYTES_TIMEOUT = 10.0  # ClientHello or first request head, resolution and connect
RESOLVE_TIMEOUT = 5.0
IDLE_TIMEOUT = 600.0  # no byte either way for this long ends a proxied connection
MAX_CONNECTIONS = 256  # per slot, at once
MAX_ADDRESSES = 4  # resolved addresses tried, in order
RESOLVES_PER_SLOT = 2  # one guest's names in flight at once (each holds a socket)
CHUNK = 1 << 16
UPSTREAM_PORTS = ProxyPorts(http=80, tls=443)
_SWITCHING = re.compile(rb"HTTP/1\.[01] 101[ \r]")


class DnsResolver:
    """Names to IPv4 addresses over DNS itself (dnspython, asyncio sockets), not getaddrinfo:
    a query the caller stops waiting for ends with it. getaddrinfo held a thread until the
    system resolver gave up, so guests asking for names that never resolve kept a fixed pool
    of threads busy after their own timeouts and stalled name rules for every sandbox on the
    host (issue 22). The host's /etc/hosts is not read: its names are the host's, not the
    internet's."""

    def __init__(self, nameservers: Sequence[str] | None = None, port: int = 53) -> None:
        """`nameservers`: those of /etc/resolv.conf when None."""
        self._resolver = dns.asyncresolver.Resolver(configure=nameservers is None)
        if nameservers is not None:
            self._resolver.nameservers = list(nameservers)
        self._resolver.port = port
        # The proxy bounds the wait (RESOLVE_TIMEOUT); this bounds one query's.
        self._resolver.lifetime = RESOLVE_TIMEOUT
        self._resolver.cache = dns.resolver.Cache()

    async def __call__(self, name: str) -> list[str]:
        literal = ipv4_literal(name)
        if literal is not None:
            return [literal]
        try:
            answer = await self._resolver.resolve(name, "A", search=False)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer, dns.resolver.NoNameservers,
                dns.exception.Timeout) as exc:
            raise OSError(f"{type(exc).__name__}: {exc}") from None
        except dns.exception.DNSException as exc:  # a malformed name or answer
            raise ValueError(str(exc)) from None
        return list(dict.fromkeys(str(record) for record in answer))[:MAX_ADDRESSES * 4]


@functools.cache
def _system_resolver() -> DnsResolver:
    return DnsResolver()


async def system_resolve(name: str) -> list[str]:
    return await _system_resolver()(name)


# -- decision -------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Rules:
    allow_names: tuple[str, ...]
    deny_names: tuple[str, ...]
    allow_nets: tuple[ipaddress.IPv4Network, ...]
    deny_nets: tuple[ipaddress.IPv4Network, ...]


@functools.lru_cache(maxsize=256)
def _rules(policy: NetworkPolicy) -> _Rules:
    (allow_nets, deny_nets), (allow_names, deny_names) = policy.cidrs(), policy.domains()
    return _Rules(tuple(allow_names), tuple(deny_names),
                  tuple(ipaddress.IPv4Network(n) for n in allow_nets),
                  tuple(ipaddress.IPv4Network(n) for n in (*deny_nets, *ALWAYS_DENIED)))


def name_allowed(policy: NetworkPolicy, name: str) -> bool:
    """`name`: normalized (egress_wire.normalize_name) or an IPv4 literal, which no domain
    entry matches."""
    rules = _rules(policy)
    if any(domain_matches(entry, name) for entry in rules.allow_names):
        return True
    if any(domain_matches(entry, name) for entry in rules.deny_names):
        return False
    return policy.internet


def address_allowed(policy: NetworkPolicy, address: str, pool: str,
                    operator_allow: tuple[str, ...] = ()) -> bool:
    """`operator_allow`: the always-denied ranges that policies may open (parse_cidrs)."""
    try:
        addr = ipaddress.IPv4Address(address)
    except ValueError:
        return False
    if addr in ipaddress.IPv4Network(pool) or _is_local(address):
        return False
    if any(addr in net for net in hard_denied(operator_allow)):
        return False
    rules = _rules(policy)
    if any(addr in net for net in rules.allow_nets):
        return True
    return not any(addr in net for net in rules.deny_nets)


def _is_local(address: str) -> bool:
    """Whether `address` is one of this host's own, whatever interface holds it: the kernel
    then picks it as the source to reach it. A UDP connect only looks the route up."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((address, 9))
        except OSError:
            return True  # no route (or broadcast): nothing to connect to either
        return bool(probe.getsockname()[0] == address)


# -- listeners ------------------------------------------------------------------------------

@dataclass
class _SlotProxy:
    slot: Slot
    policy: NetworkPolicy
    servers: list[asyncio.Server] = field(default_factory=list)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    resolving: asyncio.Semaphore = field(
        default_factory=lambda: asyncio.Semaphore(RESOLVES_PER_SLOT))


class _Activity:
    def __init__(self) -> None:
        self.last = time.monotonic()

    def touch(self) -> None:
        self.last = time.monotonic()


class EgressProxy:
    """The proxy of one runtime: listeners for the slots of its sandboxes that need one."""

    def __init__(self, ports: ProxyPorts, pool: str, *, resolver: Resolver | None = None,
                 idle_timeout: float = IDLE_TIMEOUT,
                 upstream_ports: ProxyPorts = UPSTREAM_PORTS,
                 operator_allow: Sequence[str] = ()) -> None:
        """`upstream_ports`: where a proxied connection goes, the ports the guest dialled (the
        only ones its namespace redirects); tests point them at unprivileged servers.
        `operator_allow`: the CIDRs of always-denied ranges that policies may open."""
        self.ports = ports
        self.pool = pool
        self.operator_allow = parse_cidrs(operator_allow)
        self.idle_timeout = idle_timeout
        self.upstream_ports = upstream_ports
        self._resolve: Resolver = resolver if resolver is not None else system_resolve
        self._slots: dict[int, _SlotProxy] = {}

    def listening(self) -> dict[int, list[tuple[str, int]]]:
        """Slot index -> the addresses its listeners are bound to."""
        return {index: [sock.getsockname() for server in proxy.servers
                        for sock in server.sockets]
                for index, proxy in self._slots.items()}

    async def attach(self, slot: Slot, policy: NetworkPolicy) -> None:
        """Judge `slot`'s new connections by `policy` from now on; listen for them if the
        policy needs the proxy. Idempotent. Listening stops only with detach(), once the
        namespace no longer redirects here."""
        current = self._slots.get(slot.index)
        if current is not None:
            current.policy = policy
            return
        if not policy.needs_proxy:
            return
        proxy = self._slots[slot.index] = _SlotProxy(slot, policy)
        try:
            for port, tls in ((self.ports.http, False), (self.ports.tls, True)):
                proxy.servers.append(await asyncio.start_server(
                    functools.partial(self._accept, proxy, tls), slot.host_ip, port,
                    limit=MAX_HEAD, reuse_address=True))
                if self._slots.get(slot.index) is not proxy:  # detached meanwhile
                    await _stop(proxy)
                    return
        except OSError as exc:
            self._slots.pop(slot.index, None)
            await _stop(proxy)
            raise NetworkError(f"egress proxy cannot listen on {slot.host_ip}:{port}: {exc}") \
                from exc

    async def detach(self, index: int) -> None:
        proxy = self._slots.pop(index, None)
        if proxy is not None:
            await _stop(proxy)

    async def close(self) -> None:
        for index in list(self._slots):
            await self.detach(index)

    # -- one connection ---------------------------------------------------------------------

    async def _accept(self, proxy: _SlotProxy, tls: bool, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        proxy.tasks.add(task)
        upstream: asyncio.StreamWriter | None = None
        try:
            peer = writer.get_extra_info("peername")
            if not peer or peer[0] != proxy.slot.ns_ip or len(proxy.tasks) > MAX_CONNECTIONS:
                return
            policy = proxy.policy
            async with asyncio.timeout(FIRST_BYTES_TIMEOUT):
                first, name, head = await _first_bytes(reader, tls)
                port = self.upstream_ports.tls if tls else self.upstream_ports.http
                up_reader, upstream = await self._connect(proxy, policy, name, port)
            upstream.write(first)
            await self._splice(reader, writer, up_reader, upstream, head, name)
        except Refused as exc:
            log.info("egress from %s refused: %s", proxy.slot.netns, exc)
        except (OSError, asyncio.IncompleteReadError):
            pass  # a reset, a timeout (TimeoutError is an OSError), an early close
        except Exception as exc:  # a bug must cost one connection, never the listener
            log.warning("egress proxy error for %s: %r", proxy.slot.netns, exc)
        finally:
            for end in (writer, upstream):
                if end is not None:
                    end.close()
            proxy.tasks.discard(task)

    async def _connect(self, proxy: _SlotProxy, policy: NetworkPolicy, name: str,
                       port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if not name_allowed(policy, name):
            raise Refused(f"{name} is not allowed")
        addresses: Sequence[str]
        literal = ipv4_literal(name)
        if literal is not None:
            addresses = [literal]
        else:
            try:
                async with asyncio.timeout(RESOLVE_TIMEOUT), proxy.resolving:
                    addresses = list(await self._resolve(name))
            except (OSError, ValueError) as exc:
                raise Refused(f"cannot resolve {name}: {exc}") from None
        usable = [a for a in addresses
                  if address_allowed(policy, a, self.pool, self.operator_allow)]
        if not usable:
            raise Refused(f"{name} resolves to no allowed address: {list(addresses)[:4]}")
        error: OSError | None = None
        for address in usable[:MAX_ADDRESSES]:
            try:
                return await asyncio.open_connection(address, port, limit=MAX_HEAD)
            except OSError as exc:
                error = exc
        raise Refused(f"cannot connect to {name}: {error}")

    async def _splice(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      up_reader: asyncio.StreamReader, upstream: asyncio.StreamWriter,
                      head: RequestHead | None, name: str) -> None:
        activity = _Activity()
        loop = asyncio.get_running_loop()
        upgraded = loop.create_future() if head is not None and head.upgrade else None
        outbound = _pump(reader, upstream, activity) if head is None else \
            _requests(reader, upstream, head, name, activity, upgraded)
        tasks = {asyncio.create_task(outbound),
                 asyncio.create_task(_responses(up_reader, writer, activity, upgraded))}
        try:
            pending = tasks
            while pending:
                left = activity.last + self.idle_timeout - time.monotonic()
                if left <= 0:
                    return
                done, pending = await asyncio.wait(pending, timeout=left,
                                                   return_when=asyncio.FIRST_COMPLETED)
                for finished in done:
                    error = finished.exception()
                    if error is not None:
                        raise error  # one side failed: end both
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _stop(proxy: _SlotProxy) -> None:
    for server in proxy.servers:
        server.close()
    for task in list(proxy.tasks):
        task.cancel()
    await asyncio.gather(*(s.wait_closed() for s in proxy.servers), *proxy.tasks,
                         return_exceptions=True)


async def _first_bytes(reader: asyncio.StreamReader,
                       tls: bool) -> tuple[bytes, str, RequestHead | None]:
    """What the guest sent first (to forward unchanged), the name it asks for, and for HTTP
    the parsed request head."""
    if tls:
        raw, sni = await read_client_hello(reader)
        if sni is None:
            raise Refused("no SNI")
        return raw, sni, None
    head_raw = await read_request_head(reader)
    if head_raw is None:
        raise Refused("closed before a request")
    head = parse_request_head(head_raw)
    return head_raw, head.host, head


# -- relaying -------------------------------------------------------------------------------

async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, activity: _Activity) -> None:
    while data := await src.read(CHUNK):
        activity.touch()
        dst.write(data)
        await dst.drain()
    if dst.can_write_eof():
        dst.write_eof()


async def _responses(src: asyncio.StreamReader, dst: asyncio.StreamWriter, activity: _Activity,
                     upgraded: asyncio.Future[bool] | None) -> None:
    """Upstream to guest, unchanged. After an upgrade request, the first status line says
    whether the connection stopped being HTTP (101): only then are the guest's bytes no longer
    parsed as requests."""
    try:
        if upgraded is not None:
            try:
                line = await src.readuntil(b"\r\n")
            except asyncio.IncompleteReadError as exc:
                line = exc.partial
            except asyncio.LimitOverrunError:
                raise Refused("upstream status line too long") from None
            upgraded.set_result(bool(_SWITCHING.match(line)))
            activity.touch()
            dst.write(line)
        await _pump(src, dst, activity)
    finally:
        if upgraded is not None and not upgraded.done():
            upgraded.set_result(False)


async def _requests(src: asyncio.StreamReader, dst: asyncio.StreamWriter, head: RequestHead,
                    name: str, activity: _Activity,
                    upgraded: asyncio.Future[bool] | None) -> None:
    """Guest to upstream for HTTP, the first head already sent: every later request on the
    connection must name the same host, or a keep-alive connection to an allowed site on a
    shared address would carry requests for any other site there."""
    while True:
        await _body(src, dst, head, activity)
        if upgraded is not None and head.upgrade and await upgraded:
            await _pump(src, dst, activity)
            return
        raw = await read_request_head(src)
        if raw is None:
            if dst.can_write_eof():
                dst.write_eof()
            return
        activity.touch()
        head = parse_request_head(raw)
        if head.host != name:
            raise Refused(f"request for {head.host} on a connection to {name}")
        if head.upgrade:
            raise Refused("upgrade after the first request")
        dst.write(raw)


async def _body(src: asyncio.StreamReader, dst: asyncio.StreamWriter, head: RequestHead,
                activity: _Activity) -> None:
    if head.chunked:
        while size := parse_chunk_line(await _line(src)):
            dst.write(b"%x\r\n" % size)
            await _copy(src, dst, size, activity)
            if await _exactly(src, 2) != b"\r\n":
                raise Refused("chunk not followed by CRLF")
            dst.write(b"\r\n")
        dst.write(b"0\r\n")
        trailers = 0
        while True:
            line = await _line(src)
            trailers += len(line)
            if trailers > MAX_HEAD:
                raise Refused("trailers too long")
            end = trailer_ends(line)
            dst.write(line)
            if end:
                break
    else:
        await _copy(src, dst, head.content_length, activity)
    await dst.drain()


async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter, count: int,
                activity: _Activity) -> None:
    while count > 0:
        data = await src.read(min(count, CHUNK))
        if not data:
            raise Refused("closed mid body")
        activity.touch()
        count -= len(data)
        dst.write(data)
        await dst.drain()


async def _line(src: asyncio.StreamReader) -> bytes:
    try:
        return await src.readuntil(b"\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        raise Refused("bad or unterminated line in a chunked body") from None


async def _exactly(src: asyncio.StreamReader, count: int) -> bytes:
    with contextlib.suppress(asyncio.IncompleteReadError):
        return await src.readexactly(count)
    raise Refused("closed mid body")
