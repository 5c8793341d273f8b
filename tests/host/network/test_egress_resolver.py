"""The egress proxy's resolver against a DNS server on loopback that never answers some names:
guests asking for such names hold nothing that other lookups need (no threads), and a name
that resolves still does meanwhile (issue 22: getaddrinfo threads that outlived their
timeouts stalled name rules for every sandbox on the host)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import dns.message
import dns.rcode
import dns.rrset
import pytest

from pandastack.host.network import egress_proxy
from pandastack.host.network.egress_proxy import DnsResolver

GOOD = "198.18.0.7"


class StubDns(asyncio.DatagramProtocol):
    """`good.test` has one A record, `gone.test` does not exist, `*.never.test` are never
    answered."""

    def __init__(self) -> None:
        self.queries: list[str] = []
        self.transport: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        query = dns.message.from_wire(data)
        name = query.question[0].name.to_text()
        self.queries.append(name)
        if name.endswith("never.test."):
            return
        reply = dns.message.make_response(query)
        if name == "good.test.":
            reply.answer.append(dns.rrset.from_text(name, 60, "IN", "A", GOOD))
        else:
            reply.set_rcode(dns.rcode.NXDOMAIN)
        assert self.transport is not None
        self.transport.sendto(reply.to_wire(), addr)


@pytest.fixture
async def stub() -> AsyncIterator[tuple[StubDns, int]]:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_datagram_endpoint(StubDns,
                                                              local_addr=("127.0.0.1", 0))
    try:
        yield protocol, transport.get_extra_info("sockname")[1]
    finally:
        transport.close()


async def test_names_that_never_resolve_hold_no_thread_and_block_no_other_name(
        stub: tuple[StubDns, int], monkeypatch: pytest.MonkeyPatch) -> None:
    server, port = stub
    # A stuck lookup must still be waiting at the end however slow the machine: only the
    # test's cancel ends it.
    monkeypatch.setattr(egress_proxy, "RESOLVE_TIMEOUT", 120.0)
    resolve = DnsResolver(["127.0.0.1"], port=port)
    threads = threading.active_count()
    stuck = [asyncio.create_task(resolve(f"n{i}.never.test")) for i in range(64)]
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # every stuck query is out before the good one
            if len(server.queries) >= 64:
                break
            await asyncio.sleep(0.01)
        assert len(server.queries) >= 64
        assert await resolve("good.test") == [GOOD]
        assert not any(task.done() for task in stuck), "a stuck lookup ended by itself"
        assert threading.active_count() == threads, "lookups took threads"
    finally:
        for task in stuck:
            task.cancel()
        await asyncio.gather(*stuck, return_exceptions=True)
    assert threading.active_count() == threads


async def test_a_missing_name_is_an_os_error_and_an_address_sends_no_query(
        stub: tuple[StubDns, int]) -> None:
    server, port = stub
    resolve = DnsResolver(["127.0.0.1"], port=port)
    with pytest.raises(OSError, match="NXDOMAIN"):
        await resolve("gone.test")
    before = len(server.queries)
    assert await resolve("198.18.0.9") == ["198.18.0.9"]
    assert len(server.queries) == before
