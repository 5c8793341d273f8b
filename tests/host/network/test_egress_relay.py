"""The egress proxy's relaying, on loopback only (no VMs): a slot in 127.77.0.0/30 and two
"sites" on 127.77.1.1 (allowed.test) and 127.77.1.2 (other.test), names resolved by a table."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from pandastack.host.network import egress_proxy
from pandastack.host.network.egress_proxy import EgressProxy
from pandastack.host.network.manager import NetworkError, ProxyPorts, Slot
from pandastack.hostport.network import NetworkPolicy
from tests.host.network.test_egress_wire import real_client_hello

SLOT = Slot(0, "127.77.0.0/30")  # host side 127.77.0.1, "namespace" side 127.77.0.2
SITE_A, SITE_B = "127.77.1.1", "127.77.1.2"
TABLE = {"allowed.test": [SITE_A], "other.test": [SITE_B]}
# The sites are loopback addresses: only the operator's list and an explicit CIDR allow
# together let the proxy reach them.
SITES = ("127.77.1.0/24",)
POLICY = NetworkPolicy(internet=False, allow_out=("allowed.test", *SITES))


class Site:
    """Greets every connection, records every byte it receives."""

    def __init__(self, greeting: bytes) -> None:
        self.greeting = greeting
        self.received = bytearray()
        self.connections = 0
        self.closed = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.closed.clear()
        writer.write(self.greeting)
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                self.received += data
                if self.greeting.startswith(b"echo"):
                    writer.write(data)
        writer.close()
        self.closed.set()


@dataclass
class Env:
    proxy: EgressProxy
    a: Site
    b: Site
    resolved: list[str]

    def port(self, tls: bool) -> int:
        bound = self.proxy.listening()[SLOT.index]
        return bound[1 if tls else 0][1]

    async def talk(self, data: bytes, *, tls: bool, source: str = SLOT.ns_ip,
                   eof: bool = True) -> bytes:
        """Send `data`, read what comes back until the proxy closes (bounded)."""
        reader, writer = await asyncio.open_connection(SLOT.host_ip, self.port(tls),
                                                       local_addr=(source, 0))
        writer.write(data)
        if eof:
            writer.write_eof()
        got = bytearray()
        with contextlib.suppress(OSError):
            async with asyncio.timeout(5):
                while chunk := await reader.read(65536):
                    got += chunk
        writer.close()
        return bytes(got)


Factory = Callable[..., Awaitable[Env]]


@pytest.fixture
async def make_env(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Factory]:
    # Loopback sites are the host's own addresses, which the proxy never connects to.
    monkeypatch.setattr(egress_proxy, "_is_local", lambda address: False)
    cleanup: list[Callable[[], Awaitable[None]]] = []

    async def make(policy: NetworkPolicy = POLICY, idle_timeout: float = 30.0,
                   operator_allow: tuple[str, ...] = SITES) -> Env:
        a, b = Site(b"site-a\n"), Site(b"site-b\n")
        server_a = await asyncio.start_server(a.handle, SITE_A, 0)
        port = server_a.sockets[0].getsockname()[1]
        server_b = await asyncio.start_server(b.handle, SITE_B, port)
        resolved: list[str] = []

        async def table(name: str) -> list[str]:
            resolved.append(name)
            if name not in TABLE:
                raise OSError(f"no such test name: {name}")
            return TABLE[name]

        proxy = EgressProxy(ProxyPorts(0, 0), SLOT.pool, resolver=table,
                            idle_timeout=idle_timeout, upstream_ports=ProxyPorts(port, port),
                            operator_allow=operator_allow)
        await proxy.attach(SLOT, policy)

        async def close() -> None:
            await proxy.close()
            for server in (server_a, server_b):
                server.close()

        cleanup.append(close)
        return Env(proxy, a, b, resolved)

    yield make
    for close in cleanup:
        await close()


async def settle(site: Site) -> None:
    async with asyncio.timeout(5):
        await site.closed.wait()


async def test_tls_goes_to_the_sni_name_never_to_the_dialled_address(make_env: Factory) -> None:
    env = await make_env()
    hello = real_client_hello("allowed.test")
    got = await env.talk(hello + b"after the hello", tls=True)
    await settle(env.a)
    assert got == b"site-a\n"
    assert bytes(env.a.received) == hello + b"after the hello"
    assert env.resolved == ["allowed.test"]
    assert await env.talk(real_client_hello("other.test"), tls=True) == b""
    assert await env.talk(real_client_hello(None), tls=True) == b""  # no SNI
    assert env.b.connections == 0


async def test_garbage_is_refused_and_the_proxy_keeps_serving(make_env: Factory) -> None:
    env = await make_env()
    for garbage in (b"\x00" * 100, b"\x16\x03\x01\xff\xff" + b"x" * 70000, b"\x16",
                    b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n"):
        assert await env.talk(garbage, tls=True) == b""
    for garbage in (b"\x16\x03\x01\x00\x05hello\r\n\r\n", b"x" * 70000, b"GET /\r\n\r\n"):
        assert await env.talk(garbage, tls=False) == b""
    assert env.a.connections == env.b.connections == 0
    assert await env.talk(b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", tls=False) == \
        b"site-a\n"


async def test_only_the_slots_own_address_is_served(make_env: Factory) -> None:
    env = await make_env()
    got = await env.talk(b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", tls=False,
                         source="127.77.0.3")
    assert got == b"" and env.a.connections == 0


async def test_every_keep_alive_request_must_name_the_same_host(make_env: Factory) -> None:
    env = await make_env()
    first = b"GET /1 HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
    again = b"GET /2 HTTP/1.1\r\nHost: ALLOWED.test:80\r\n\r\n"
    other = b"GET /3 HTTP/1.1\r\nHost: other.test\r\n\r\n"
    await env.talk(first + again + other + again, tls=False)
    await settle(env.a)
    assert bytes(env.a.received) == first + again


async def test_chunked_bodies_are_framed_and_normalized(make_env: Factory) -> None:
    env = await make_env()
    head = b"POST /up HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n"
    # A request for another host inside a chunk is body, not a request.
    inner = b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n"
    body = b"%x;ext=1\r\n%s\r\n0\r\nX-Sum: 1\r\n\r\n" % (len(inner), inner)
    second = b"POST /b HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 5\r\n\r\nhello"
    await env.talk(head + body + second, tls=False)
    await settle(env.a)
    assert bytes(env.a.received) == \
        head + b"%x\r\n%s\r\n0\r\nX-Sum: 1\r\n\r\n" % (len(inner), inner) + second
    env.a.received.clear()
    await env.talk(head + b"5\r\nhelloXX0\r\n\r\n", tls=False)  # chunk without its CRLF
    await settle(env.a)
    assert bytes(env.a.received) == head + b"5\r\nhello"


async def test_upgrade_switches_to_raw_bytes_only_on_101(make_env: Factory) -> None:
    env = await make_env()
    upgrade = (b"GET /ws HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: websocket\r\n"
               b"Connection: Upgrade\r\n\r\n")
    frames = b"\x81\x05hello, not HTTP at all"
    env.a.greeting = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"
    got = await env.talk(upgrade + frames, tls=False)
    await settle(env.a)
    assert got == env.a.greeting and bytes(env.a.received) == upgrade + frames
    env.a.received.clear()
    env.a.greeting = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"
    await env.talk(upgrade + frames, tls=False)
    await settle(env.a)
    assert bytes(env.a.received) == upgrade
    # h2c would name a host per stream: even when the server switches, the guest's next
    # bytes are parsed as HTTP/1.x, and the HTTP/2 preface is refused.
    env.a.received.clear()
    env.a.greeting = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n"
    h2c = (b"GET / HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: h2c\r\n"
           b"Connection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n")
    await env.talk(h2c + b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00" * 30, tls=False)
    await settle(env.a)
    assert bytes(env.a.received) == h2c


async def test_policy_changes_apply_to_new_connections(make_env: Factory) -> None:
    env = await make_env()
    request = b"GET / HTTP/1.1\r\nHost: %s\r\n\r\n"
    assert await env.talk(request % b"other.test", tls=False) == b""
    await env.proxy.attach(SLOT, NetworkPolicy(internet=False,
                                               allow_out=(".other.test", "127.77.1.0/24")))
    assert await env.talk(request % b"other.test", tls=False) == b"site-b\n"
    assert await env.talk(request % b"allowed.test", tls=False) == b""
    # Internet on, names denied: what is not denied goes through, to its own address.
    await env.proxy.attach(SLOT, NetworkPolicy(internet=True, deny_out=("other.test",),
                                               allow_out=("127.77.1.0/24",)))
    assert await env.talk(request % b"other.test", tls=False) == b""
    assert await env.talk(request % b"allowed.test", tls=False) == b"site-a\n"
    # Resolved into a range the policy does not open: refused.
    await env.proxy.attach(SLOT, NetworkPolicy(internet=True, deny_out=("other.test",)))
    assert await env.talk(request % b"allowed.test", tls=False) == b""


async def test_detach_closes_listeners_and_connections(make_env: Factory) -> None:
    env = await make_env()
    port = env.port(tls=True)
    reader, writer = await asyncio.open_connection(SLOT.host_ip, port,
                                                   local_addr=(SLOT.ns_ip, 0))
    writer.write(real_client_hello("allowed.test"))
    assert await reader.readline() == b"site-a\n"  # spliced
    await env.proxy.detach(SLOT.index)
    async with asyncio.timeout(5):
        assert await reader.read() == b""
    writer.close()
    assert env.proxy.listening() == {}
    with pytest.raises(OSError):
        await asyncio.open_connection(SLOT.host_ip, port, local_addr=(SLOT.ns_ip, 0))
    # A policy without names does not listen at all.
    await env.proxy.attach(SLOT, NetworkPolicy(internet=False, allow_out=("127.77.1.0/24",)))
    assert env.proxy.listening() == {}


async def test_a_taken_port_is_an_error_and_leaves_nothing() -> None:
    taken = await asyncio.start_server(lambda r, w: None, SLOT.host_ip, 0)
    try:
        port = taken.sockets[0].getsockname()[1]
        proxy = EgressProxy(ProxyPorts(0, port), SLOT.pool)
        with pytest.raises(NetworkError):
            await proxy.attach(SLOT, POLICY)
        assert proxy.listening() == {}
    finally:
        taken.close()


async def test_idle_connections_end(make_env: Factory) -> None:
    env = await make_env(idle_timeout=0.5)
    reader, writer = await asyncio.open_connection(SLOT.host_ip, env.port(tls=True),
                                                   local_addr=(SLOT.ns_ip, 0))
    writer.write(real_client_hello("allowed.test"))
    assert await reader.readline() == b"site-a\n"
    async with asyncio.timeout(5):
        assert await reader.read() == b""
    writer.close()
    await settle(env.a)


async def test_an_allowed_name_resolving_into_the_denied_set_is_refused(
        make_env: Factory) -> None:
    # allowed.test resolves to a loopback address; 0.0.0.0/0 must not open it, nor must an
    # explicit CIDR outside the operator's list.
    env = await make_env(NetworkPolicy(internet=False, allow_out=("allowed.test", "0.0.0.0/0")),
                         operator_allow=())
    assert await env.talk(b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", tls=False) == b""
    assert await env.talk(real_client_hello("allowed.test"), tls=True) == b""
    assert env.a.connections == 0
    await env.proxy.attach(SLOT, POLICY)
    assert await env.talk(b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", tls=False) == b""
    assert env.a.connections == 0
