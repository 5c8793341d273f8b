"""AgentClient against the REAL guest agent (run on this host as a subprocess in --fd test
mode, over a socketpair), plus a fake guest for hostile-byte tests. No VM needed."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import pandastack
from pandastack.guestproto import frames as P
from pandastack.host.agentlink import handshake
from pandastack.host.agentlink.client import AgentClient
from pandastack.hostport.errors import AgentConnectionError, AgentProtocolError, GuestOSError
from tests.host.fake_guest import FakeGuest, in_thread

pytestmark = pytest.mark.timeout(60)

SRC = str(Path(pandastack.__file__).resolve().parents[1])


def start_agent() -> tuple[socket.socket, subprocess.Popen[bytes]]:
    host_end, agent_end = socket.socketpair()
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pandastack.guest", "--fd", str(agent_end.fileno())],
        pass_fds=[agent_end.fileno()],
        env=env,
    )
    agent_end.close()
    return host_end, proc


@contextlib.asynccontextmanager
async def local_agent() -> AsyncIterator[AgentClient]:
    """A client of a real agent started by `start_agent`, closed and reaped on exit."""
    sock, proc = start_agent()
    client = await AgentClient.from_socket(sock, timeout=10)
    try:
        yield client
    finally:
        await client.close()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
async def agent() -> AsyncIterator[AgentClient]:
    async with local_agent() as client:
        yield client


def pids_with_marker(marker: str) -> list[int]:
    """Live (non-zombie) processes whose argv contains ``marker``."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{d}/cmdline").read_bytes()
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        state = stat.rsplit(")", 1)[1].split()[0]
        if marker.encode() in cmdline and state not in ("Z", "X"):
            found.append(int(d))
    return found


# -- exec ----------------------------------------------------------------------------------


async def test_exec_python(agent: AgentClient) -> None:
    r = await agent.exec("python3 -c 'print(6*7)'")
    assert (r.exit_code, r.stdout, r.stderr) == (0, b"42\n", b"")
    assert not r.timed_out and r.signal is None and not r.truncated
    assert r.duration_ms > 0


async def test_exec_failure_code_and_stderr(agent: AgentClient) -> None:
    r = await agent.exec("echo out; echo oops >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr) == (3, b"out\n", b"oops\n")


async def test_unknown_command_is_127(agent: AgentClient, tmp_path: Path) -> None:
    r = await agent.exec("no-such-command-pandastack")
    assert r.exit_code == 127 and b"not found" in r.stderr
    r = await agent.exec(["no-such-command-pandastack", "arg"])
    assert r.exit_code == 127 and b"no-such-command-pandastack" in r.stderr
    (tmp_path / "noexec").write_text("#!/bin/sh\n")
    r = await agent.exec([str(tmp_path / "noexec")])  # exists but not executable
    assert r.exit_code == 126 and b"noexec" in r.stderr


async def test_killed_by_signal_is_128_plus_n(agent: AgentClient) -> None:
    r = await agent.exec("kill -TERM $$")
    assert (r.exit_code, r.signal, r.timed_out) == (143, 15, False)


async def test_timeout_kills_whole_tree(agent: AgentClient) -> None:
    marker = f"3{os.getpid() % 1000}.{time.monotonic_ns() % 10**6}"
    t0 = time.monotonic()
    r = await agent.exec(f"sleep {marker} & sleep {marker}; echo never", timeout=0.5)
    assert time.monotonic() - t0 < 5
    assert r.timed_out and r.exit_code == 137 and r.signal == 9
    assert b"never" not in r.stdout
    deadline = time.monotonic() + 3
    while pids_with_marker(marker) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert pids_with_marker(marker) == []


async def test_env_cwd_stdin(agent: AgentClient, tmp_path: Path) -> None:
    r = await agent.exec(
        ["sh", "-c", 'echo "$FOO|$HOME|$LANG|$PATH"; pwd; cat'],
        env={"FOO": "bar baz"},
        cwd=str(tmp_path),
        stdin=b"from stdin\n",
    )
    lines = r.stdout.decode().splitlines()
    foo, home, lang, path = lines[0].split("|")
    assert (foo, home, lang) == ("bar baz", "/root", "C.UTF-8")
    assert "/usr/local/sbin" in path and "/bin" in path.split(":")
    assert lines[1] == str(tmp_path)
    assert lines[2] == "from stdin"
    r = await agent.exec("cat", stdin=b"")
    assert (r.exit_code, r.stdout) == (0, b"")
    r = await agent.exec("cat </dev/stdin | wc -c")  # no stdin given: /dev/null
    assert r.stdout.strip() == b"0"


async def test_big_stdin_and_stdout_flow(agent: AgentClient) -> None:
    data = os.urandom(3 * 2**20 + 17)
    r = await agent.exec(["cat"], stdin=data, timeout=30)
    assert r.exit_code == 0 and r.stdout == data


async def test_missing_cwd_is_enoent(agent: AgentClient) -> None:
    with pytest.raises(GuestOSError) as ei:
        await agent.exec("true", cwd="/nonexistent/pandastack")
    assert ei.value.errno_name == "ENOENT"


async def test_streaming_callbacks_see_output_before_exit(agent: AgentClient) -> None:
    seen: list[tuple[float, bytes]] = []

    async def on_out(b: bytes) -> None:
        seen.append((time.monotonic(), b))

    errs: list[bytes] = []
    r = await agent.exec(
        "echo first; echo e >&2; sleep 0.4; echo second", on_stdout=on_out, on_stderr=errs.append
    )
    end = time.monotonic()
    assert r.stdout == b"first\nsecond\n" and errs == [b"e\n"]
    assert seen[0][1] == b"first\n"
    assert end - seen[0][0] > 0.3  # delivered while the process was still running


async def test_max_output_truncates_but_drains(agent: AgentClient) -> None:
    got = 0

    def count(b: bytes) -> None:
        nonlocal got
        got += len(b)

    r = await agent.exec("head -c 3000000 /dev/zero", max_output=1000, on_stdout=count)
    assert r.exit_code == 0 and r.truncated and len(r.stdout) == 1000
    assert got == 3000000


async def test_spawn_attach_signal_stdin(agent: AgentClient) -> None:
    pid = await agent.spawn(["sh", "-c", "cat; echo bye >&2"])
    await agent.send_stdin(pid, b"hello ")
    await agent.send_stdin(pid, b"world", eof=True)
    r = await agent.attach(pid, timeout=10)
    assert (r.exit_code, r.stdout, r.stderr) == (0, b"hello world", b"bye\n")
    r2 = await agent.attach(pid, timeout=10)  # after exit: buffered output + exit again
    assert r2.stdout == b"hello world"

    pid2 = await agent.spawn("echo started; exec sleep 30", env={"X": "1"}, cwd="/")
    procs = {p["pid"]: p for p in await agent.procs()}
    assert procs[pid2]["running"] is True and procs[pid]["running"] is False
    assert procs[pid]["exit_code"] == 0
    started = asyncio.Event()
    waiter = asyncio.create_task(agent.attach(pid2, on_stdout=lambda b: started.set(), timeout=10))
    await asyncio.wait_for(started.wait(), 5)
    await agent.signal(pid2, 15)
    r3 = await waiter
    assert (r3.exit_code, r3.signal, r3.stdout) == (143, 15, b"started\n")
    with pytest.raises(GuestOSError) as ei:
        await agent.attach(999999999)
    assert ei.value.errno_name == "ESRCH"


async def test_attach_streams_live_output(agent: AgentClient) -> None:
    pid = await agent.spawn("for i in 1 2 3; do echo $i; sleep 0.1; done")
    chunks: list[bytes] = []
    r = await agent.attach(pid, on_stdout=chunks.append, timeout=10)
    assert r.stdout == b"1\n2\n3\n" and b"".join(chunks) == r.stdout


async def test_attach_timeout_leaves_process_running(agent: AgentClient) -> None:
    pid = await agent.spawn(["sleep", "30"])
    with pytest.raises(AgentConnectionError):
        await agent.attach(pid, timeout=0.2)
    procs = {p["pid"]: p for p in await agent.procs()}
    assert procs[pid]["running"] is True
    await agent.signal(pid, 9)
    r = await agent.attach(pid, timeout=5)
    assert r.exit_code == 137


async def test_init_is_acknowledged_not_applied_in_test_mode(agent: AgentClient) -> None:
    before = socket.gethostname()
    await agent.init(
        time_ns=1_000_000_000, entropy=os.urandom(64), hostname="sbx-test", machine_id="a" * 32
    )
    assert socket.gethostname() == before
    assert abs(time.time() - time.time()) < 1
    with pytest.raises(GuestOSError) as ei:
        await agent.init(time_ns=1, entropy=bytes(64), hostname="bad name!", machine_id="x")
    assert ei.value.errno_name == "EINVAL"


# -- files ---------------------------------------------------------------------------------


async def test_large_file_roundtrip(agent: AgentClient, tmp_path: Path) -> None:
    size = 20 * 2**20
    block = os.urandom(2**20)
    want = hashlib.sha256()

    async def gen() -> AsyncIterator[bytes]:
        for i in range(size // len(block)):
            chunk = block[i:] + block[:i]  # odd chunk boundaries are fine too
            want.update(chunk)
            yield chunk

    path = str(tmp_path / "big.bin")
    assert await agent.write_file(path, gen()) == size
    got = hashlib.sha256()
    n = 0
    async for chunk in agent.read_file(path):
        assert len(chunk) <= P.MAX_CHUNK
        got.update(chunk)
        n += len(chunk)
    assert n == size and got.hexdigest() == want.hexdigest()
    assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == want.hexdigest()


async def test_slow_reader_is_bounded_by_credit(agent: AgentClient, tmp_path: Path) -> None:
    path = tmp_path / "slow.bin"
    path.write_bytes(os.urandom(8 * 2**20))
    it = agent.read_file(str(path))
    first = await it.__anext__()
    await asyncio.sleep(0.4)  # the agent would send all 8 MiB in this time without credits
    assert agent._buffered_bytes() <= P.INITIAL_WINDOW
    rest = [c async for c in it]
    assert first + b"".join(rest) == path.read_bytes()


async def test_read_offset_length_and_abandon(agent: AgentClient, tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(bytes(range(256)) * 8192)  # 2 MiB
    part = b"".join([c async for c in agent.read_file(str(p), offset=10, length=300000)])
    assert part == p.read_bytes()[10:300010]
    it = agent.read_file(str(p))
    await it.__anext__()
    await it.aclose()  # abandoning a transfer cancels it in the agent
    assert await agent.ping() > 0


async def test_write_creates_parents_mode_append(agent: AgentClient, tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "c.txt"
    assert await agent.write_file(str(path), b"one\n", mode=0o600) == 4
    assert path.read_bytes() == b"one\n" and (path.stat().st_mode & 0o777) == 0o600
    assert await agent.write_file(str(path), b"two\n", append=True) == 4
    assert path.read_bytes() == b"one\ntwo\n"
    assert await agent.write_file(str(path), b"") == 0
    assert path.read_bytes() == b""


async def test_fs_ops(agent: AgentClient, tmp_path: Path) -> None:
    d = tmp_path / "d"
    await agent.mkdir(str(d / "x" / "y"))
    await agent.mkdir(str(d / "x" / "y"))  # parents=True: exists is fine
    with pytest.raises(GuestOSError) as ei:
        await agent.mkdir(str(d / "x"), parents=False)
    assert ei.value.errno_name == "EEXIST"
    await agent.write_file(str(d / "file.txt"), b"12345")
    os.symlink("file.txt", d / "link")
    entries = {e.name: e for e in await agent.list_dir(str(d))}
    assert set(entries) == {"x", "file.txt", "link"}
    assert entries["x"].type == "dir" and entries["link"].type == "symlink"
    f = entries["file.txt"]
    assert (f.type, f.size, f.mode, f.path) == ("file", 5, 0o644, str(d / "file.txt"))
    assert abs(f.mtime - time.time()) < 60
    st = await agent.stat(str(d / "file.txt"))
    assert (st.name, st.type, st.size) == ("file.txt", "file", 5)
    await agent.rename(str(d / "file.txt"), str(d / "renamed.txt"))
    assert (d / "renamed.txt").read_bytes() == b"12345"
    with pytest.raises(GuestOSError) as ei:
        await agent.remove(str(d / "x"))
    assert ei.value.errno_name in ("ENOTEMPTY", "EEXIST")
    await agent.remove(str(d / "x"), recursive=True)
    await agent.remove(str(d / "renamed.txt"))
    assert sorted(os.listdir(d)) == ["link"]
    await agent.sync()


async def test_big_directory_lists_whole(agent: AgentClient, tmp_path: Path) -> None:
    """An honest listing over several `entries` frames stays within the host's bounds."""
    names = {f"file-with-a-longish-name-{i:06d}.txt" for i in range(30_000)}
    for name in names:
        (tmp_path / name).touch()
    entries = await agent.list_dir(str(tmp_path))
    assert {e.name for e in entries} == names
    assert await agent.ping() > 0


async def test_enoent(agent: AgentClient) -> None:
    for call in (
        agent.read_file_bytes("/nonexistent/pandastack/f"),
        agent.stat("/nonexistent/pandastack/f"),
        agent.list_dir("/nonexistent/pandastack"),
        agent.remove("/nonexistent/pandastack/f"),
    ):
        with pytest.raises(GuestOSError) as ei:
            await call
        assert ei.value.errno_name == "ENOENT"
        assert ei.value.path == "/nonexistent/pandastack" or "/nonexistent" in str(ei.value.path)
    with pytest.raises(GuestOSError) as ei:
        await agent.write_file("/proc/pandastack-no/x", b"data")
    assert ei.value.errno_name in ("ENOENT", "EACCES", "EPERM", "EROFS")


async def test_enospc_surfaces(agent: AgentClient) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    with pytest.raises(GuestOSError) as ei:
        await agent.write_file("/dev/full", b"x" * 100000)
    assert ei.value.errno_name == "ENOSPC"
    assert await agent.ping() > 0


async def test_many_concurrent_operations(agent: AgentClient, tmp_path: Path) -> None:
    async def one_exec(i: int) -> None:
        r = await agent.exec(f"sleep 0.3; echo {i}", timeout=20)
        assert r.stdout == f"{i}\n".encode()

    async def one_file(i: int) -> None:
        data = os.urandom(300_000 + i)
        p = str(tmp_path / f"f{i}")
        await agent.write_file(p, data)
        assert await agent.read_file_bytes(p) == data

    async def pings() -> None:
        for _ in range(20):
            assert await agent.ping() < 5000

    async def streamer() -> None:
        r = await agent.exec("head -c 5000000 /dev/urandom | base64", timeout=30)
        assert r.exit_code == 0 and len(r.stdout) > 5_000_000

    t0 = time.monotonic()
    await asyncio.gather(
        *(one_exec(i) for i in range(10)),
        *(one_file(i) for i in range(5)),
        pings(),
        streamer(),
    )
    assert time.monotonic() - t0 < 20


async def test_exec_cancel_kills_process(agent: AgentClient) -> None:
    marker = f"7{os.getpid() % 1000}.{time.monotonic_ns() % 10**6}"
    task = asyncio.create_task(agent.exec(["sleep", marker]))
    deadline = time.monotonic() + 30
    while not pids_with_marker(marker):  # cancelled only once it runs
        assert not task.done() and time.monotonic() < deadline, "the sleep never started"
        await asyncio.sleep(0.05)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    deadline = time.monotonic() + 30
    while pids_with_marker(marker) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert pids_with_marker(marker) == []
    assert await agent.ping() > 0


# -- connecting ----------------------------------------------------------------------------


async def test_connect_waits_for_socket(tmp_path: Path) -> None:
    path = tmp_path / "agent.sock"
    host_end, proc = start_agent()

    async def bridge(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        ar, aw = await asyncio.open_connection(sock=host_end)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
            dst.close()

        await asyncio.gather(pump(r, aw), pump(ar, w), return_exceptions=True)

    async def serve_later() -> asyncio.Server:
        await asyncio.sleep(0.3)
        return await asyncio.start_unix_server(bridge, path=str(path))

    server_task = asyncio.create_task(serve_later())
    client = await AgentClient.connect(path, timeout=10)
    server = await server_task
    try:
        assert client.agent_version and client.agent_pid == proc.pid
        assert (await client.exec(["echo", "via socket"])).stdout == b"via socket\n"
    finally:
        await client.close()
        await in_thread(lambda: proc.wait(5))  # the bridge passes the EOF on meanwhile
        server.close()

    t0 = time.monotonic()
    with pytest.raises(AgentConnectionError):
        await AgentClient.connect(tmp_path / "never.sock", timeout=0.3)
    assert time.monotonic() - t0 < 2


# -- a fake guest that misbehaves ----------------------------------------------------------


async def test_handshake_skips_garbage(fake: FakeGuest) -> None:
    stale = P.frame("stdout", 5, b"old output") + b"PS\x01\x00\xff\xff" + os.urandom(3000)
    stale += P.frame("hello", 0, v=1, nonce="someone-else")
    task = asyncio.create_task(AgentClient.from_socket(fake.host_end, timeout=5))
    await in_thread(lambda: fake.answer_hello(prefix=stale))
    client = await task

    def pong() -> None:
        f = fake.recv_frame()
        fake.send(P.frame("pong", f.id))

    t = asyncio.create_task(in_thread(pong))
    assert await client.ping() >= 0
    await t
    await client.close()


async def test_handshake_pads_and_retries(fake: FakeGuest, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handshake, "HELLO_RETRY", 0.2)

    def stuck_then_answer() -> None:
        first = fake.recv_frame()  # pretend it was swallowed by a half-read frame
        while (f := fake.dec.scan(lambda fr: fr.t == "hello")) is None:
            fake.dec.feed(fake.sock.recv(1 << 20))  # the padding, then the second hello
        assert f.header["nonce"] != first.header["nonce"]
        # A late answer to the first hello must not be taken for the second.
        fake.send(P.frame("hello", 0, v=1, nonce=first.header["nonce"]))
        fake.send(P.frame("hello", 0, v=1, nonce=f.header["nonce"]))

    t = asyncio.create_task(in_thread(stuck_then_answer))
    client = await AgentClient.from_socket(fake.host_end, timeout=5)
    await t
    assert not client.broken
    await client.close()


async def test_handshake_deadline(fake: FakeGuest) -> None:
    t0 = time.monotonic()
    with pytest.raises(AgentConnectionError):
        await AgentClient.from_socket(fake.host_end, timeout=0.4)
    assert time.monotonic() - t0 < 2


async def test_handshake_gives_up_on_endless_garbage(
    fake: FakeGuest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handshake, "MAX_RESYNC_BYTES", 2**20)
    task = asyncio.create_task(AgentClient.from_socket(fake.host_end, timeout=10))
    with contextlib.suppress(OSError):  # the client hangs up once it has had enough
        await in_thread(lambda: fake.send(b"\x00PS" * 500_000))
    with pytest.raises(AgentConnectionError):
        await task


@pytest.mark.parametrize(
    "bad",
    [
        b"\x00" * 12,  # garbage
        b"PS\x01\x00\x7f\xff\xff\xff\x00\x00\x00\x00",  # oversized header length
        b"PS\x01\x00\x00\x00\x00\x02\x7f\xff\xff\xff",  # oversized payload length
        P.frame("stdout", 1, b"x")[:15] + P.frame("pong", 1),  # truncated, then more frames
        P.frame("bogus", 1),  # valid frame, unknown type
        P.frame("credit", 1, n=-5),  # invalid field
        P.frame("exit", 1, code="zero", timed_out=False, duration_ms=1.0),
    ],
)
async def test_bad_frames_break_the_client(fake: FakeGuest, bad: bytes) -> None:
    client = await fake.client(op_timeout=10)
    t0 = time.monotonic()
    pending = [asyncio.create_task(client.exec("x")), asyncio.create_task(client.ping())]
    await in_thread(lambda: (fake.recv_frame(), fake.recv_frame()))
    await in_thread(lambda: fake.send(bad))
    for task in pending:
        with pytest.raises(AgentProtocolError):
            await task
    assert time.monotonic() - t0 < 3
    assert client.broken
    with pytest.raises(AgentProtocolError):
        await client.ping()
    await client.close()


async def test_credit_overrun_is_a_protocol_error(fake: FakeGuest) -> None:
    client = await fake.client()
    it = client.read_file("/x")
    first = asyncio.create_task(it.__anext__())  # take one chunk, then consume no more
    f = await in_thread(fake.recv_frame)
    assert isinstance(f, P.Frame) and f.t == "read_file"

    def flood() -> None:  # more than the initial window, with no credit granted
        fake.send(P.frame("file", f.id, size=10 * 2**20))
        for _ in range(P.INITIAL_WINDOW // P.MAX_CHUNK + 1):
            fake.send(P.frame("data", f.id, bytes(P.MAX_CHUNK)))

    await in_thread(flood)
    assert len(await first) == P.MAX_CHUNK
    for _ in range(100):
        if client.broken:
            break
        await asyncio.sleep(0.02)
    with pytest.raises(AgentProtocolError):
        await asyncio.wait_for(it.__anext__(), 5)
    assert client.broken
    await client.close()


async def test_guest_closing_fails_pending_ops(fake: FakeGuest) -> None:
    client = await fake.client()
    task = asyncio.create_task(client.exec("x"))
    await in_thread(fake.recv_frame)
    await in_thread(lambda: fake.send(P.frame("stdout", 1, b"partial")[:20]))
    fake.sock.shutdown(socket.SHUT_RDWR)
    with pytest.raises(AgentConnectionError):
        await asyncio.wait_for(task, 5)
    assert client.broken
    await client.close()


async def test_silent_guest_hits_op_deadline(fake: FakeGuest) -> None:
    client = await fake.client(op_timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(AgentConnectionError):
        await client.ping()
    with pytest.raises(AgentConnectionError):
        await client.exec("x", timeout=0.1)  # waits timeout + op_timeout at most
    assert time.monotonic() - t0 < 3
    assert not client.broken  # a slow guest is not a broken channel
    await client.close()


async def test_guest_error_frame_on_id_zero_breaks_client(fake: FakeGuest) -> None:
    client = await fake.client()
    task = asyncio.create_task(client.ping())
    await in_thread(fake.recv_frame)
    await in_thread(lambda: fake.send(P.frame("error", 0, code="EPROTO", message="lost sync")))
    with pytest.raises(AgentProtocolError):
        await task
    assert client.broken
    await client.close()


async def test_frozen_agent_fails_an_open_ended_exec_instead_of_hanging() -> None:
    sock, proc = start_agent()
    client = await AgentClient.from_socket(sock, timeout=10, op_timeout=1.0)
    client.liveness_interval = 0.5
    try:
        task = asyncio.create_task(client.exec("sleep 60"))  # no deadline of its own
        await asyncio.sleep(0.5)
        os.kill(proc.pid, signal.SIGSTOP)  # the agent stops answering, the channel stays open
        started = time.monotonic()
        with pytest.raises(AgentConnectionError, match="stopped answering"):
            await asyncio.wait_for(task, 10)
        assert time.monotonic() - started < 5
        assert client.broken
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        await client.close()
