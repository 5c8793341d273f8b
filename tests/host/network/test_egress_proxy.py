"""Domain rules through the egress proxy, with real VMs and namespaces.

Network safety: the only "internet" is a namespace this module creates (two addresses in the
benchmarking range, routed to it), serving allowed.test and other.test over HTTP and HTTPS.
Names are resolved by a table handed to the runtime; a guard fails the module if anything
asks the real resolver for a name (the guests have no DNS either: `--resolve` in curl is the
"forged answer", pointing a name at whichever address the test likes).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pandastack.host.config import HostConfig
from pandastack.host.network import egress_proxy
from pandastack.host.network.manager import Slot, list_netns
from pandastack.host.runtime import HostRuntime
from pandastack.host.runtime.sandbox import SandboxHandle
from tests.leftovers import owned_tmpdir

_NET = os.getpid() % 250
INET_NS = f"pse-inet-{os.getpid()}"
INET_VETH = f"pte{os.getpid()}"[:15]
HOST_SIDE_IP = f"198.19.{_NET}.254"
ALLOWED_IP = f"198.19.{_NET}.1"
OTHER_IP = f"198.19.{_NET}.2"
TABLE = {"allowed.test": [ALLOWED_IP], "other.test": [OTHER_IP]}
ALLOWED_PAGE = "real-allowed host=allowed.test"
UPSTREAM = Path(__file__).with_name("egress_upstream.py")

pytestmark = pytest.mark.vm


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check)


@pytest.fixture(scope="module")
def egress_internet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    certs = tmp_path_factory.mktemp("egress-certs")
    servers: list[subprocess.Popen[bytes]] = []
    try:
        sh("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
           "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj", "/CN=allowed.test",
           "-addext", "subjectAltName=DNS:allowed.test,DNS:other.test",
           "-keyout", str(certs / "key.pem"), "-out", str(certs / "cert.pem"))
        sh("ip", "netns", "add", INET_NS)
        sh("ip", "link", "add", INET_VETH, "type", "veth", "peer", "name", "eth0",
           "netns", INET_NS)
        sh("ip", "addr", "add", f"{HOST_SIDE_IP}/24", "dev", INET_VETH)
        sh("ip", "link", "set", INET_VETH, "up")
        for ip in (ALLOWED_IP, OTHER_IP):
            sh("ip", "-n", INET_NS, "addr", "add", f"{ip}/24", "dev", "eth0")
        sh("ip", "-n", INET_NS, "link", "set", "eth0", "up")
        sh("ip", "-n", INET_NS, "link", "set", "lo", "up")
        sh("ip", "-n", INET_NS, "route", "add", "default", "via", HOST_SIDE_IP)
        # Network safety: both addresses route into our namespace before anything dials them.
        for ip in (ALLOWED_IP, OTHER_IP):
            assert f"dev {INET_VETH}" in sh("ip", "route", "get", ip).stdout
        for ip, tag in ((ALLOWED_IP, "real-allowed"), (OTHER_IP, "real-other")):
            servers.append(subprocess.Popen(
                ["ip", "netns", "exec", INET_NS, sys.executable, str(UPSTREAM), ip, tag,
                 str(certs / "cert.pem"), str(certs / "key.pem")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wanted = {f"{ip}:{port}" for ip in (ALLOWED_IP, OTHER_IP) for port in (80, 443)}
        deadline = time.monotonic() + 60
        while not all(w in sh("ip", "netns", "exec", INET_NS, "ss", "-ltn",
                              check=False).stdout for w in wanted):
            assert time.monotonic() < deadline, "test sites did not start"
            time.sleep(0.05)
        yield
    finally:
        for server in servers:
            server.kill()
            server.wait()
        sh("ip", "netns", "del", INET_NS, check=False)
        sh("ip", "link", "del", INET_VETH, check=False)


@pytest.fixture(scope="module")
def resolved() -> Iterator[list[str]]:
    """Names the runtimes' table resolver was asked for. Also the guard: the real resolver
    (the proxy's default, or getaddrinfo with a test name) fails the module if called."""
    leaks: list[str] = []
    real_getaddrinfo = socket.getaddrinfo

    def guarded(host: Any, *args: Any, **kwargs: Any) -> Any:
        if ".test" in str(host):
            leaks.append(str(host))
            raise socket.gaierror(socket.EAI_NONAME, "test names never reach real DNS")
        return real_getaddrinfo(host, *args, **kwargs)

    async def system_resolve(name: str) -> list[str]:
        leaks.append(name)
        raise OSError("the real resolver was called in a test")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(egress_proxy, "system_resolve", system_resolve)
        patch.setattr(socket, "getaddrinfo", guarded)
        yield []
    assert leaks == [], f"names sent to the real resolver: {leaks}"


RuntimeOpener = Callable[[Path], Awaitable[HostRuntime]]


@pytest.fixture(scope="module")
async def open_runtime(egress_internet: None, host_config: HostConfig,
                       resolved: list[str]) -> AsyncIterator[RuntimeOpener]:
    """Opens runtimes on a state dir, resolving names by TABLE; all are killed and closed
    (and their state dirs checked empty) at the end."""
    opened: list[tuple[HostRuntime, Path]] = []

    async def table(name: str) -> list[str]:
        resolved.append(name)
        if name not in TABLE:
            raise OSError(f"no such test name: {name}")
        return TABLE[name]

    async def open_(state: Path) -> HostRuntime:
        config = dataclasses.replace(host_config, state_dir=state, dns="off")
        rt = HostRuntime(config, progress=lambda m: None, resolver=table)
        await rt.start()
        opened.append((rt, state))
        return rt

    yield open_
    for rt, _ in opened:
        await rt.kill_all()
        await rt.close()
        assert rt.egress.listening() == {}
    for _, state in opened:
        left = list(state.iterdir()) if state.exists() else []
        shutil.rmtree(state, ignore_errors=True)
        assert left == [], f"left behind: {left}"


def new_state_dir() -> Path:
    return owned_tmpdir("pse-")


@pytest.fixture(scope="module")
async def rt(open_runtime: RuntimeOpener) -> HostRuntime:
    return await open_runtime(new_state_dir())


async def fetch(sbx: SandboxHandle, url: str, via: str | None = None, *,
                timeout: int = 20) -> str | None:
    """The page at `url` from inside the guest, its name pointed at `via` (curl's --resolve:
    the guest's own idea of the address), or None when the connection fails. A dropped
    connection fails at its handshake, which on this machine's own veth takes milliseconds
    when it is let through: 5 s for it, not the whole `timeout` per refusal."""
    argv = ["curl", "-sk", "-m", str(timeout), "--connect-timeout", "5", url]
    if via is not None:
        host = url.split("/")[2]
        port = 443 if url.startswith("https") else 80
        argv += ["--resolve", f"{host}:{port}:{via}"]
    result = await sbx.exec(argv, timeout=40)
    return result.stdout.decode().strip() if result.exit_code == 0 else None


async def guest_python(sbx: SandboxHandle, code: str) -> str:
    result = await sbx.exec(["python3", "-c", code], timeout=90)
    assert result.exit_code == 0, result
    return result.stdout.decode()


def listeners(address: str) -> set[int]:
    """Ports with a listening TCP socket bound to `address` on the host."""
    ports = set()
    for line in sh("ss", "-ltnH").stdout.splitlines():
        local = line.split()[3]
        host, _, port = local.rpartition(":")
        if host == address:
            ports.add(int(port))
    return ports


def slot_of(rt: HostRuntime, sbx: SandboxHandle) -> Slot:
    slot = rt.describe(sbx.id)["slot"]
    assert isinstance(slot, Slot)
    return slot


def namespace_rules(slot: Slot) -> str:
    return sh("ip", "netns", "exec", slot.netns, "nft", "list", "table", "inet",
              "pandastack").stdout


KEEP_ALIVE = f"""
import socket
s = socket.create_connection(("{OTHER_IP}", 80), 20)
s.settimeout(20)
s.sendall(b"GET /1 HTTP/1.1\\r\\nHost: allowed.test\\r\\n\\r\\n")
first = b""
while b"host=allowed.test" not in first:
    chunk = s.recv(65536)
    if not chunk:
        break
    first += chunk
s.sendall(b"GET /2 HTTP/1.1\\r\\nHost: other.test\\r\\n\\r\\n")
rest = b""
try:
    while chunk := s.recv(65536):
        rest += chunk
except OSError as exc:
    rest += repr(exc).encode()
print(first.decode(errors="replace"))
print("---")
print(rest.decode(errors="replace"))
"""

GARBAGE = f"""
import socket
for port, payload in ((443, b"\\x00" * 64), (443, b"\\x16\\x03\\x01\\xff\\xff" + b"A" * 20000),
                      (443, b"GET / HTTP/1.1\\r\\nHost: allowed.test\\r\\n\\r\\n"),
                      (80, b"\\x16\\x03\\x01\\x00\\x05hello\\r\\n\\r\\n")):
    s = socket.create_connection(("{ALLOWED_IP}", port), 20)
    s.settimeout(20)
    try:
        s.sendall(payload)
        print(repr(s.recv(100)))
    except OSError as exc:
        print("closed", exc)
"""


async def test_a_name_rule_reaches_that_names_server_and_nothing_else(
        rt: HostRuntime, resolved: list[str]) -> None:
    sbx = await rt.create(network={"internet": False, "allow_out": ["allowed.test"]})
    try:
        slot = slot_of(rt, sbx)
        ports = (rt.config.egress_http_port, rt.config.egress_tls_port)
        assert listeners(slot.host_ip) == set(ports)
        host_rules = sh("nft", "list", "table", "inet", "pandastack_host").stdout
        assert f"tcp dport {{ {ports[0]}, {ports[1]} }} accept" in host_rules, host_rules
        assert await fetch(sbx, "https://allowed.test/", ALLOWED_IP) == ALLOWED_PAGE
        assert "allowed.test" in resolved  # on the host, by the runtime's resolver
        # A forged answer (other.test's address) still reaches the real allowed.test.
        assert await fetch(sbx, "https://allowed.test/", OTHER_IP) == ALLOWED_PAGE
        assert await fetch(sbx, "http://allowed.test/", OTHER_IP) == ALLOWED_PAGE
        # Another name gets nothing, whichever address the guest dials.
        assert await fetch(sbx, "https://other.test/", OTHER_IP) is None
        assert await fetch(sbx, "https://other.test/", ALLOWED_IP) is None
        assert await fetch(sbx, "http://other.test/", ALLOWED_IP) is None
        assert await fetch(sbx, f"https://{ALLOWED_IP}/") is None  # no SNI
        assert await fetch(sbx, f"http://{ALLOWED_IP}/") is None  # an address is no name
        # The proxy's port is only reachable through the redirect (this is dropped).
        assert await fetch(sbx, f"http://{slot.host_ip}:{rt.config.egress_http_port}/",
                           timeout=5) is None

        # A keep-alive connection cannot switch to another site on the same server.
        out = await guest_python(sbx, KEEP_ALIVE)
        first, rest = out.split("---")
        assert ALLOWED_PAGE in first and "other" not in rest, out
        # Garbage is closed on, and the proxy keeps serving.
        out = await guest_python(sbx, GARBAGE)
        assert out.splitlines() and all(line in ("b''",) or line.startswith("closed")
                                        for line in out.splitlines()), out
        assert await fetch(sbx, "https://allowed.test/", OTHER_IP) == ALLOWED_PAGE
    finally:
        await rt.kill(sbx.id)


async def test_policy_updates_and_denied_names(rt: HostRuntime) -> None:
    sbx = await rt.create(network={"internet": False})
    try:
        slot = slot_of(rt, sbx)
        assert slot.index not in rt.egress.listening()
        assert await fetch(sbx, "https://allowed.test/", ALLOWED_IP) is None

        await rt.update_network(sbx.id, {"internet": False, "allow_out": ["allowed.test"]})
        rules = namespace_rules(slot)
        assert f"dnat ip to {slot.host_ip}:{rt.config.egress_tls_port}" in rules
        assert "udp dport 443 drop" in rules  # QUIC falls back to TCP, which is judged
        assert await fetch(sbx, "https://allowed.test/", OTHER_IP) == ALLOWED_PAGE

        await rt.update_network(sbx.id, {"internet": False, "allow_out": ["*.test"]})
        assert await fetch(sbx, "https://other.test/", ALLOWED_IP) == \
            "real-other host=other.test"

        # Internet on, one name denied: that name is refused, others go to their own server.
        await rt.update_network(sbx.id, {"internet": True, "deny_out": ["other.test"]})
        assert await fetch(sbx, "https://other.test/", OTHER_IP) is None
        assert await fetch(sbx, "http://other.test/", OTHER_IP) is None
        assert await fetch(sbx, "https://allowed.test/", OTHER_IP) == ALLOWED_PAGE

        # An address allowed by CIDR keeps its direct path, whatever the name.
        await rt.update_network(sbx.id, {"internet": False,
                                         "allow_out": ["allowed.test", f"{OTHER_IP}/32"]})
        assert await fetch(sbx, "https://other.test/", OTHER_IP) == "real-other host=other.test"
        assert await fetch(sbx, "https://allowed.test/", ALLOWED_IP) == ALLOWED_PAGE

        await rt.update_network(sbx.id, {"internet": False})
        assert slot.index not in rt.egress.listening()
        assert listeners(slot.host_ip) == set()
        rules = namespace_rules(slot)
        assert f"{slot.host_ip}:" not in rules and "udp dport 443" not in rules
        assert await fetch(sbx, "https://allowed.test/", ALLOWED_IP) is None
    finally:
        await rt.kill(sbx.id)


async def test_restart_brings_the_proxy_back_and_kill_and_close_leave_nothing(
        open_runtime: RuntimeOpener) -> None:
    state = new_state_dir()
    first = await open_runtime(state)
    sbx = await first.create(network={"internet": False, "allow_out": [".allowed.test"]})
    slot = slot_of(first, sbx)
    assert await fetch(sbx, "https://allowed.test/", OTHER_IP) == ALLOWED_PAGE
    await first.close()  # the VM keeps running; its namespace still redirects to the proxy
    assert first.egress.listening() == {}
    assert listeners(slot.host_ip) == set()

    second = await open_runtime(state)
    assert [h.id for h in second.list()] == [sbx.id]
    again = second.get(sbx.id)
    assert listeners(slot.host_ip) == {second.config.egress_http_port,
                                       second.config.egress_tls_port}
    assert await fetch(again, "https://allowed.test/", OTHER_IP) == ALLOWED_PAGE
    assert await fetch(again, "https://other.test/", OTHER_IP) is None

    await second.kill(sbx.id)
    assert listeners(slot.host_ip) == set()
    assert slot.index not in second.egress.listening()
    assert slot.netns not in list_netns()  # with it, its nft rules
