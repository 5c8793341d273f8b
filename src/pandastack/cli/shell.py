"""`pandastack sandbox shell ID [--cmd CMD]`: this terminal becomes a terminal in the sandbox.

The local terminal goes to raw mode, so every key (Ctrl-C, Ctrl-Z, arrows, Tab) goes to the
guest as typed and the guest's line discipline and programs do the rest; the window size is
sent at start and on every SIGWINCH. The command exits with the shell's (or CMD's) exit code
and leaves the sandbox running. When stdin is not a terminal the bytes read are typed all the
same (the guest echoes them, as a terminal does), and its end is a Ctrl-D.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import termios
import threading
import tty
from collections.abc import Iterator
from types import FrameType

from pandastack.sdk import PandastackError, Pty, Sandbox

READ_SIZE = 64 * 1024
EOF_KEY = b"\x04"


def window_size(fd: int) -> tuple[int, int]:
    """(cols, rows) of the terminal on `fd`, else 80x24."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return 80, 24
    return max(1, min(size.columns, 1000)), max(1, min(size.lines, 1000))


@contextlib.contextmanager
def raw_mode(fd: int) -> Iterator[None]:
    """`fd`'s terminal in raw mode while inside (restored however the block ends)."""
    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd, termios.TCSANOW)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSAFLUSH, saved)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class _Wakeup:
    """A pipe the main loop selects on: SIGWINCH and the output's end write to it (a signal
    handler must not call the WebSocket, whose lock the interrupted main thread may hold)."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def poke(self, what: bytes) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self.w, what)

    def take(self) -> bytes:
        try:
            return os.read(self.r, 4096)
        except BlockingIOError:
            return b""

    def close(self) -> None:
        os.close(self.r)
        os.close(self.w)


def terminal(sbx: Sandbox, cmd: str | None, *, stdin_fd: int | None = None,
             stdout_fd: int | None = None) -> int:
    """Run `cmd` (or the user's shell) on a terminal in `sbx`, wired to this one; its exit
    code."""
    in_fd = sys.stdin.fileno() if stdin_fd is None else stdin_fd
    out_fd = sys.stdout.fileno() if stdout_fd is None else stdout_fd
    size_fd = out_fd if os.isatty(out_fd) else in_fd
    cols, rows = window_size(size_fd)
    pty = sbx.pty.create(cols=cols, rows=rows, cmd=cmd)
    wake = _Wakeup()
    failure: list[BaseException] = []

    def pump_output(p: Pty) -> None:
        try:
            for chunk in p:
                _write_all(out_fd, chunk)
        except BaseException as exc:  # reported by the main thread
            failure.append(exc)
        finally:
            wake.poke(b"x")

    def on_winch(_sig: int, _frame: FrameType | None) -> None:
        wake.poke(b"w")

    previous = signal.signal(signal.SIGWINCH, on_winch)
    reader = threading.Thread(target=pump_output, args=(pty,), name="pty-output", daemon=True)
    try:
        with raw_mode(in_fd):
            reader.start()
            _pump_input(pty, in_fd, size_fd, wake, reader)
        reader.join(10)
        if failure:
            raise failure[0]
        return pty.wait(10)
    finally:
        signal.signal(signal.SIGWINCH, previous)
        pty.disconnect()
        wake.close()


def _pump_input(pty: Pty, in_fd: int, size_fd: int, wake: _Wakeup,
                reader: threading.Thread) -> None:
    reading = True
    while reader.is_alive():
        fds = [wake.r, in_fd] if reading else [wake.r]
        try:
            ready, _, _ = select.select(fds, [], [])
        except InterruptedError:
            continue
        try:
            if wake.r in ready:
                got = wake.take()
                if b"w" in got:
                    pty.resize(*window_size(size_fd))
                if b"x" in got:
                    return
            if in_fd in ready:
                data = os.read(in_fd, READ_SIZE)
                if data:
                    pty.send_stdin(data)
                else:  # end of a piped stdin: what Ctrl-D at a terminal is
                    pty.send_stdin(EOF_KEY)
                    reading = False
        except PandastackError:
            reader.join(2)
            if reader.is_alive():
                raise
            return  # the process ended as we typed: its exit is what counts
