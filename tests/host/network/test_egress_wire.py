"""The egress proxy's parsers and decisions, on hostile input (no VMs, no network)."""

from __future__ import annotations

import asyncio
import ssl
import struct

import pytest

from pandastack.host.network import egress_proxy
from pandastack.host.network.egress_proxy import address_allowed, name_allowed, system_resolve
from pandastack.host.network.egress_wire import (
    MAX_HEAD,
    Refused,
    domain_matches,
    parse_chunk_line,
    parse_client_hello,
    parse_request_head,
    read_client_hello,
    read_request_head,
    trailer_ends,
)
from pandastack.hostport.network import NetworkPolicy, normalize_name, parse_domain_entry

POOL = "10.200.0.0/16"


def real_client_hello(server_hostname: str | None) -> bytes:
    """The first flight of Python's own TLS client: real records, as curl would send."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = context.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


def vec(size: int, data: bytes) -> bytes:
    return len(data).to_bytes(size, "big") + data


def sni_ext(*names: bytes, kind: int = 0) -> bytes:
    entries = b"".join(bytes([kind]) + vec(2, n) for n in names)
    return struct.pack(">H", 0) + vec(2, vec(2, entries))


def hello_message(extensions: bytes | None, *, session: bytes = b"", suites: bytes = b"\x13\x01",
                  version: bytes = b"\x03\x03", trailer: bytes = b"") -> bytes:
    body = version + b"\x00" * 32 + vec(1, session) + vec(2, suites) + vec(1, b"\x00")
    if extensions is not None:
        body += vec(2, extensions)
    body += trailer
    return b"\x01" + len(body).to_bytes(3, "big") + body


def records(message: bytes, *, split: int | None = None) -> bytes:
    parts = [message] if split is None else [message[:split], message[split:]]
    return b"".join(b"\x16\x03\x01" + vec(2, p) for p in parts)


async def hello_from(data: bytes) -> tuple[bytes, str | None]:
    reader = asyncio.StreamReader(limit=MAX_HEAD)
    reader.feed_data(data)
    reader.feed_eof()
    return await read_client_hello(reader)


# -- names ----------------------------------------------------------------------------------

def test_names_are_normalized_and_addresses_are_not_names() -> None:
    assert normalize_name("Allowed.TEST.") == "allowed.test"
    assert normalize_name("xn--bcher-kva.example") == "xn--bcher-kva.example"
    for bad in ("", ".", "a..b", "bad name", "ex\u00e4mple.com", "a" * 64 + ".com",
                ("a" * 63 + ".") * 4 + "com", "1.2.3.4", "1.2.3", "0x7f000001", "017.0.0.1",
                "127.1", "example.123", "a/b", "a:b", "a\x00b"):
        assert normalize_name(bad) is None, bad


def test_domain_entries_and_matching() -> None:
    assert parse_domain_entry("Example.com") == "example.com"
    assert parse_domain_entry("*.Example.com") == "*.example.com"
    assert parse_domain_entry(".example.com") == ".example.com"
    for bad in ("*example.com", "*.", "..example.com", "*.*.example.com", "exa mple.com"):
        assert parse_domain_entry(bad) is None, bad
    assert domain_matches("example.com", "example.com")
    assert not domain_matches("example.com", "www.example.com")
    assert domain_matches("*.example.com", "a.b.example.com")
    assert not domain_matches("*.example.com", "example.com")
    assert not domain_matches("*.example.com", "badexample.com")
    assert domain_matches(".example.com", "example.com")
    assert domain_matches(".example.com", "www.example.com")
    assert not domain_matches(".example.com", "wwwexample.com")


def test_policy_splits_cidrs_from_names_and_needs_the_proxy_only_for_names() -> None:
    policy = NetworkPolicy.from_dict({"internet": False,
                                      "allow_out": ["203.0.113.0/24", "Allowed.test"]})
    assert policy.cidrs() == (["203.0.113.0/24"], [])
    assert policy.domains() == (["allowed.test"], [])
    assert policy.needs_proxy
    assert not NetworkPolicy.from_dict({"allow_out": ["203.0.113.7"]}).needs_proxy
    # An allowed name only matters while the internet is off.
    assert not NetworkPolicy.from_dict({"allow_out": ["allowed.test"]}).needs_proxy
    # A denied name only matters while the internet is on.
    assert NetworkPolicy.from_dict({"deny_out": ["evil.test"]}).needs_proxy
    assert not NetworkPolicy.from_dict({"internet": False, "deny_out": ["evil.test"]}).needs_proxy
    with pytest.raises(ValueError):
        NetworkPolicy.from_dict({"allow_out": ["*.*.test"]})


def test_decisions() -> None:
    closed = NetworkPolicy(internet=False, allow_out=("allowed.test", "*.cdn.test",
                                                      "10.9.0.0/16"))
    assert name_allowed(closed, "allowed.test")
    assert name_allowed(closed, "a.cdn.test")
    assert not name_allowed(closed, "other.test")
    assert not name_allowed(closed, "www.allowed.test")
    assert not name_allowed(closed, "198.51.100.1")  # an address literal is no allowed name
    open_ = NetworkPolicy(internet=True, allow_out=("good.evil.test",),
                          deny_out=(".evil.test", "198.51.100.0/24"))
    assert name_allowed(open_, "anything.test")
    assert not name_allowed(open_, "evil.test") and not name_allowed(open_, "x.evil.test")
    assert name_allowed(open_, "good.evil.test")  # allow_out wins
    assert address_allowed(open_, "198.18.0.1", POOL)
    assert not address_allowed(open_, "198.51.100.7", POOL)  # denied CIDR
    for never in ("127.0.0.1", "169.254.169.254", "192.168.1.1", "10.1.2.3", "0.0.0.0",
                  "224.0.0.1", "not an address", "::1"):
        assert not address_allowed(open_, never, POOL), never
    assert egress_proxy._is_local("127.0.0.1")  # the host's own: never, whatever the policy
    # A CIDR allow opens an always-denied range only where the operator's list holds it,
    # and never the slot pool.
    assert not address_allowed(closed, "10.9.1.1", POOL)
    assert address_allowed(closed, "10.9.1.1", POOL, ("10.9.0.0/16",))
    assert not address_allowed(closed, "10.9.2.1", POOL, ("10.9.1.0/24",))
    assert not address_allowed(NetworkPolicy(allow_out=("10.0.0.0/8",)), "10.200.0.1", POOL,
                               ("10.0.0.0/8",))
    # A policy's wide allow (or a name resolving there) never reaches what is denied.
    wide = NetworkPolicy(internet=False, allow_out=("allowed.test", "0.0.0.0/0"))
    assert address_allowed(wide, "198.18.0.1", POOL)
    for never in ("169.254.169.254", "127.0.0.1", "10.1.2.3", "192.168.1.1", "100.64.0.1"):
        assert not address_allowed(wide, never, POOL), never
    assert not address_allowed(wide, "10.1.2.3", POOL, ("10.9.0.0/16",))
    assert address_allowed(wide, "10.9.1.1", POOL, ("10.9.0.0/16",))


# -- TLS ------------------------------------------------------------------------------------

async def test_real_client_hello_gives_its_sni_and_its_exact_bytes() -> None:
    data = real_client_hello("Allowed.test")
    raw, name = await hello_from(data + b"more")
    assert name == "allowed.test" and raw == data
    assert (await hello_from(real_client_hello(None)))[1] is None


async def test_client_hello_split_over_records() -> None:
    message = hello_message(sni_ext(b"allowed.test"))
    for split in (1, 3, 4, 20, len(message) - 1):
        raw, name = await hello_from(records(message, split=split))
        assert name == "allowed.test" and raw == records(message, split=split)


@pytest.mark.parametrize("data", [
    b"",
    b"\x16\x03",  # truncated header
    b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n",  # HTTP on the TLS port
    b"\x17\x03\x03\x00\x05hello",  # application data first
    b"\x16\x02\x00\x00\x05hello",  # SSL 2-ish version
    b"\x16\x03\x01\x00\x00",  # empty record
    b"\x16\x03\x01\xff\xff" + b"\x00" * 70000,  # record longer than TLS allows
    b"\x16\x03\x01\x00\x04\x02\x00\x00\x00",  # ServerHello, not ClientHello
    b"\x16\x03\x01\x00\x04\x01\xff\xff\xff",  # handshake claims 16 MiB
    records(hello_message(sni_ext(b"allowed.test")))[:-3],  # truncated body
    records(hello_message(sni_ext(b"allowed.test")) + b"\x00"),  # bytes after the hello
])
async def test_malformed_tls_is_refused(data: bytes) -> None:
    with pytest.raises(Refused):
        await hello_from(data)


@pytest.mark.parametrize("message", [
    hello_message(sni_ext(b"allowed.test") + sni_ext(b"other.test")),  # duplicate extension
    hello_message(sni_ext(b"allowed.test", b"other.test")),  # two names
    hello_message(sni_ext(b"allowed.test", kind=1)),  # unknown name type
    hello_message(sni_ext(b"")),
    hello_message(sni_ext(b"allowed.test.")),
    hello_message(sni_ext(b"198.18.0.1")),  # an address is not a server name
    hello_message(sni_ext(b"al\xc3\xa9.test")),
    hello_message(sni_ext(b"bad name.test")),
    hello_message(sni_ext(b"allowed.test") + struct.pack(">HH", 0xFE0D, 0)),  # ECH
    hello_message(sni_ext(b"allowed.test")[:-2]),  # extension shorter than it claims
    hello_message(sni_ext(b"allowed.test"), trailer=b"\x00"),
    hello_message(sni_ext(b"allowed.test"), session=b"\x00" * 33),
    hello_message(sni_ext(b"allowed.test"), suites=b""),
    hello_message(sni_ext(b"allowed.test"), suites=b"\x13"),
    hello_message(sni_ext(b"allowed.test"), version=b"\x02\x00"),
    b"\x01\x00\x00\x10" + b"\x03\x03",  # length says more than there is
])
def test_malformed_client_hello_is_refused(message: bytes) -> None:
    with pytest.raises(Refused):
        parse_client_hello(message)


def test_client_hello_without_extensions_has_no_name() -> None:
    assert parse_client_hello(hello_message(None)) is None
    assert parse_client_hello(hello_message(b"")) is None


def test_client_hello_fuzz_never_crashes() -> None:
    import random

    rng = random.Random(7)
    base = bytearray(hello_message(sni_ext(b"allowed.test") + struct.pack(">HH", 10, 0)))
    for _ in range(5000):
        data = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        try:
            name = parse_client_hello(bytes(data[:rng.randint(0, len(data))]))
        except Refused:
            continue
        assert name is None or normalize_name(name) == name


# -- HTTP -----------------------------------------------------------------------------------

def test_request_heads() -> None:
    head = parse_request_head(b"GET / HTTP/1.1\r\nHost: Allowed.Test:80\r\nAccept: */*\r\n\r\n")
    assert (head.method, head.host, head.content_length, head.chunked) == \
        ("GET", "allowed.test", 0, False)
    head = parse_request_head(b"POST /x HTTP/1.1\r\nhost:allowed.test\r\n"
                              b"Content-Length: 12\r\n\r\n")
    assert head.content_length == 12
    head = parse_request_head(b"POST /x HTTP/1.1\r\nHost: allowed.test\r\n"
                              b"Transfer-Encoding: Chunked\r\n\r\n")
    assert head.chunked
    head = parse_request_head(b"GET http://allowed.test:80/a?b HTTP/1.1\r\n"
                              b"Host: allowed.test\r\n\r\n")
    assert head.host == "allowed.test"
    head = parse_request_head(b"GET / HTTP/1.1\r\nHost: 198.18.0.1\r\nUpgrade: websocket\r\n"
                              b"Connection: Upgrade\r\n\r\n")
    assert head.host == "198.18.0.1" and head.upgrade
    assert not parse_request_head(b"GET / HTTP/1.1\r\nHost: a.test\r\nUpgrade: h2c\r\n"
                                  b"Connection: Upgrade, HTTP2-Settings\r\n\r\n").upgrade
    assert parse_request_head(b"OPTIONS * HTTP/1.1\r\nHost: a.test\r\n\r\n").host == "a.test"


@pytest.mark.parametrize("head", [
    b"GET / HTTP/1.1\r\n\r\n",  # no Host
    b"GET / HTTP/1.0\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: allowed.test\r\nHost: other.test\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: allowed.test, other.test\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: allowed.test\r\n other.test\r\n\r\n",  # folded
    b"GET / HTTP/1.1\r\nHost : allowed.test\r\n\r\n",
    b"GET / HTTP/1.1\nHost: allowed.test\r\n\r\n",  # bare LF
    b"GET / HTTP/1.1\r\nHost: allowed.test\rX: y\r\n\r\n",  # bare CR
    b"GET / HTTP/1.1\r\nHost: allowed.test\x00\r\n\r\n",
    b"GET http://other.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
    b"GET http://allowed.test@other.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
    b"GET https://other.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
    b"CONNECT other.test:443 HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    b"GET * HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
    b"GET  / HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
    b"get / HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
    b"GET / HTTP/2\r\nHost: allowed.test\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: [::1]\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: allowed.test:99999\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: allowed.test:\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: allowed.test.\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: 0x7f000001\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: al\xc3\xa9.test\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: -1\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 99999999999999999\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n",
    b"POST / HTTP/1.0\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"\x16\x03\x01\x00\x05hello\r\n\r\n",  # TLS on the HTTP port
])
def test_malformed_request_heads_are_refused(head: bytes) -> None:
    with pytest.raises(Refused):
        parse_request_head(head)


async def test_request_head_reads_are_bounded() -> None:
    reader = asyncio.StreamReader(limit=MAX_HEAD)
    reader.feed_data(b"GET / HTTP/1.1\r\nX: " + b"a" * (MAX_HEAD + 10))
    with pytest.raises(Refused):
        await read_request_head(reader)
    reader = asyncio.StreamReader(limit=MAX_HEAD)
    reader.feed_data(b"GET / HTTP/1.1\r\nHost: a.test\r\n")
    reader.feed_eof()
    with pytest.raises(Refused):  # truncated
        await read_request_head(reader)
    reader = asyncio.StreamReader(limit=MAX_HEAD)
    reader.feed_eof()
    assert await read_request_head(reader) is None  # a clean end between requests


async def test_system_resolver_with_an_address_sends_no_query() -> None:
    assert await system_resolve("127.0.0.1") == ["127.0.0.1"]


def test_chunk_and_trailer_lines() -> None:
    assert parse_chunk_line(b"1a\r\n") == 26
    assert parse_chunk_line(b"0;name=value\r\n") == 0
    for bad in (b"\r\n", b"-1\r\n", b"1a\n", b"1a \r\n", b"0x1a\r\n", b"1" * 16 + b"\r\n",
                b"1;\x00\r\n", b"g\r\n"):
        with pytest.raises(Refused):
            parse_chunk_line(bad)
    assert trailer_ends(b"\r\n")
    assert not trailer_ends(b"X-Sum: 1\r\n")
    for bad in (b"no colon\r\n", b" folded: x\r\n", b"X: a\rb\r\n"):
        with pytest.raises(Refused):
            trailer_ends(bad)
