"""Terminals against a live server and real VMs: through the SDK (sync and async), through
hibernation and wake and into a fork's child, and `pandastack sandbox shell` driven through a
real pseudo-terminal (pexpect). One sandbox serves the module."""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import sys
import time
from collections.abc import Callable, Iterator

import pexpect
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from pandastack import APIConnectionError, AsyncSandbox, NotFoundError, PandastackError, Sandbox
from pandastack.sdk import Pty
from tests.e2e.conftest import LiveServer

pytestmark = [pytest.mark.vm, pytest.mark.e2e, pytest.mark.timeout(600)]

PROMPTLY = 60.0  # a guard against a hang; TCG guests answer in well under a second


@pytest.fixture(scope="module")
def sbx(live_server: LiveServer) -> Iterator[Sandbox]:
    with Sandbox.create(ttl_seconds=900, api_url=live_server.api_url,
                        api_key=live_server.api_key) as s:
        yield s
        # A kill returns once the signal is sent; the exit is reported when the agent has
        # reaped the tree (later on a loaded host): wait for that, bounded.
        deadline = time.monotonic() + PROMPTLY
        while (left := [p for p in s.commands.list() if p.running]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"processes left running: {left}"


class Screen:
    """What one attachment has shown so far (its output comes by on_data to a queue, so a
    read gives up after PROMPTLY instead of hanging), read on until a marker appears."""

    def __init__(self, connect: Callable[[Callable[[bytes], object]], Pty]) -> None:
        self.seen = bytearray()
        self._chunks: queue.Queue[bytes] = queue.Queue()
        self.pty = connect(self._chunks.put)

    def until(self, needle: bytes) -> bytes:
        deadline = time.monotonic() + PROMPTLY
        start = len(self.seen)
        while needle not in self.seen[start:]:
            left = deadline - time.monotonic()
            assert left > 0, f"no {needle!r} in {bytes(self.seen[-2000:])!r}"
            with contextlib.suppress(queue.Empty):
                self.seen += self._chunks.get(timeout=left)
        return bytes(self.seen[start:])

    def run(self, line: str, marker: str) -> bytes:
        """Type `line; echo <marker computed by the shell>` and read up to the marker (the
        echo of the typed line itself does not contain it)."""
        left, right = marker[:len(marker) // 2], marker[len(marker) // 2:]
        self.pty.send_stdin(f"{line}; echo {left}''{right}\n")
        return self.until(marker.encode() + b"\r\n")


def test_terminal_size_ctrl_c_full_screen_reattach_and_exit(sbx: Sandbox,
                                                           live_server: LiveServer) -> None:
    screen = Screen(lambda on_data: sbx.pty.create(cols=80, rows=24, on_data=on_data))
    pty = screen.pty
    try:
        out = screen.run("stty size; tty", "M1")
        assert b"24 80" in out and b"/dev/pts/" in out
        pty.resize(100, 30)
        assert b"30 100" in screen.run("stty size", "M2")
        pty.send_stdin("sleep 100\n")
        # ^C once the shell runs it: sent earlier, bash can take it and then read the line
        until(lambda: sbx.commands.run(f"pgrep -P {pty.pid} -x sleep || true").stdout.strip()
              != "")
        pty.send_stdin("\x03")
        assert b"alive" in screen.run("echo al''ive", "M3")  # the shell lived through ^C
        pty.send_stdin("top -d 1\n")  # full screen: reads keys raw, paints with escapes
        assert b"\x1b[" in screen.until(b"load average")
        pty.send_stdin("q")  # one key, no Enter; top flushes what was typed after it
        screen.until(b"\x1b[?2004h")  # so wait for bash's prompt (bracketed paste on)
        screen.run("echo top-q''uit", "M4")
        screen.run("echo before-attach", "M5")
        # A second client (not `with`: leaving that would kill the sandbox).
        other = Sandbox.connect(sbx.id, api_url=live_server.api_url,
                                api_key=live_server.api_key)
        try:
            second = Screen(lambda on_data: other.pty.connect(pty.pid, on_data=on_data))
            assert b"before-attach" in second.until(b"M5")  # the guest's recent output
            screen.run("echo lat''er", "M6")
            assert b"later" in second.until(b"M6\r\n")
            pty.send_stdin("exit 3\n")
            assert second.pty.wait(PROMPTLY) == 3
            second.pty.disconnect()
        finally:
            other.close()
        assert pty.wait(PROMPTLY) == 3
    finally:
        if pty.exit_code is None:
            pty.kill()
        pty.disconnect()
    with pytest.raises(NotFoundError):
        sbx.pty.connect(999999)
    url = live_server.api_url.replace("http://", "ws://") + f"/v1/sandboxes/{sbx.id}/pty/1"
    for headers in ({}, {"Authorization": "Bearer psk_wrong"}):
        with pytest.raises(InvalidStatus) as refused:
            ws_connect(url, additional_headers=headers, open_timeout=PROMPTLY)
        assert refused.value.response.status_code == 401
        assert b'"code":"unauthorized"' in refused.value.response.body.replace(b" ", b"")


def test_terminal_lives_through_hibernation_and_into_a_fork(sbx: Sandbox) -> None:
    screen = Screen(lambda on_data: sbx.pty.create(cmd="bash --norc -i", on_data=on_data))
    pty = screen.pty
    try:
        screen.run("X=4$((1+1))", "H1")
        pty.disconnect()
        sbx.hibernate()
        sbx.wake()
        again = Screen(lambda on_data: sbx.pty.connect(pty.pid, on_data=on_data))
        assert b"H1" in again.until(b"H1")  # the ring came back with the guest's memory
        assert b"42" in again.run("echo $X", "H2")  # and so did the shell and its variable
        again.pty.disconnect()
        (child,) = sbx.fork()
        try:
            in_child = Screen(lambda on_data: child.pty.connect(pty.pid, on_data=on_data))
            assert b"42" in in_child.run("echo $X; X=7", "F1")
            in_child.pty.send_stdin("exit 4\n")
            assert in_child.pty.wait(PROMPTLY) == 4
            in_child.pty.disconnect()
        finally:
            child.kill()
            child.close()
        parent = Screen(lambda on_data: sbx.pty.connect(pty.pid, on_data=on_data))
        assert b"42" in parent.run("echo $X", "F2")  # the child's terminal was its own copy
        parent.pty.kill()
        assert parent.pty.wait(PROMPTLY) == 137
        parent.pty.disconnect()
    finally:
        with contextlib.suppress(PandastackError):  # killed above, unless a step failed
            sbx.pty.connect(pty.pid).kill()


def test_async_terminal_with_on_data(sbx: Sandbox, live_server: LiveServer) -> None:
    async def main() -> None:
        asbx = await AsyncSandbox.connect(sbx.id, api_url=live_server.api_url,
                                          api_key=live_server.api_key)
        try:
            seen = bytearray()
            pty = await asbx.pty.create(cmd=["sh", "-c", "read line; echo got-$line; exit 9"],
                                        on_data=seen.extend)
            await pty.send_stdin(b"abc\n")
            assert await pty.wait(PROMPTLY) == 9
            assert b"got-abc" in seen
            await pty.disconnect()
            sleeper = await asbx.pty.create(cmd="sleep 300")
            await sleeper.disconnect()
            assert [chunk async for chunk in sleeper] == []  # its own detach: a plain end
            with pytest.raises(APIConnectionError):
                await sleeper.wait(PROMPTLY)
            await (await asbx.pty.connect(sleeper.pid)).kill()
        finally:
            await asbx.close()  # not kill(): the module's sandbox

    asyncio.run(main())


def until(ready: Callable[[], bool]) -> None:
    """Until `ready()` (each call bounded by itself), for at most PROMPTLY seconds."""
    deadline = time.monotonic() + PROMPTLY
    while not ready():
        assert time.monotonic() < deadline, "not ready in time"
        time.sleep(0.2)


def test_cli_shell_under_a_real_terminal(sbx: Sandbox, live_server: LiveServer) -> None:
    env = {**os.environ, "PANDASTACK_API": live_server.api_url,
           "PANDASTACK_API_KEY": live_server.api_key, "TERM": "xterm"}
    child = pexpect.spawn(sys.executable, ["-m", "pandastack", "sandbox", "shell", sbx.id],
                          env=env, dimensions=(24, 80), timeout=PROMPTLY)
    try:
        child.expect(rb"[#$] ")  # the guest shell's prompt
        child.sendline("echo hi$((1+1))")
        child.expect(b"hi2")
        child.sendline("sleep 100")
        # The ^C must reach the sleep, not the shell still reading its line: wait for it.
        until(lambda: sbx.commands.run("pgrep -x sleep || true").stdout.strip() != "")
        child.sendcontrol("c")  # raw mode: the byte goes to the guest, which sends SIGINT
        child.sendline("echo alive$((3+4))")
        child.expect(b"alive7")
        child.setwinsize(30, 100)  # SIGWINCH to the CLI, a resize to the guest
        # The resize travels CLI -> server -> guest on its own: ask until the guest has it.
        def resized() -> bool:
            child.sendline("stty size")
            child.expect(rb"\r(\d+) (\d+)\r\n")
            return bool(child.match.groups() == (b"30", b"100"))
        until(resized)
        child.sendline("exit 5")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 5
