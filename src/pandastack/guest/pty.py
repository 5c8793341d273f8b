"""Terminals: processes on a pseudo-terminal (ops ``pty`` and ``pty_attach``).

A PTY process is a managed process (same table, cgroup leaf, kill, exit code, ``procs``
listing) whose stdin, stdout and stderr are the slave side of a fresh pty: it is the leader
of a new session with that terminal as its controlling tty, so the line discipline turns a
``\\x03`` written to the master into SIGINT for the foreground job, and TIOCSWINSZ on the
master into SIGWINCH. Its output (the master's reads) goes into the process's stdout ring,
smaller than a pipe's: a re-attach repaints a screen, it does not replay a log.

The process outlives its attachments: a host that goes away (hibernation, a restart, a
fork's parent) leaves it running, and a later ``pty_attach`` gets the ring, then live output.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import queue
import struct
import subprocess
import termios
import threading
import time
from typing import Any

from pandastack.guestproto.frames import Frame
from pandastack.guestproto.ops import PTY_COLS, PTY_MAX_DIM, PTY_ROWS

from .execs import WireSink, _command, _env, _proc, _user
from .ops import Handler, Op, OpError, arg_int, arg_opt_str
from .procs import DEFAULT_ENV, ManagedProcess, ProcessTable, RingBuffer, User, user_env

PTY_RING_BYTES = 256 * 1024
MAX_PTYS = 64
"""Live PTY processes at once: each holds a pty pair and two threads in the agent."""
"""Largest column or row count a client may ask for."""
DEFAULT_TERM = "xterm-256color"
FALLBACK_SHELL = "/bin/sh"


def set_winsize(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _take_ctty() -> None:
    """In the child (after setsid): make stdin, the pty's slave, the controlling terminal.
    Only an ioctl: nothing here takes a lock another thread of the agent could hold."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _dims(h: dict[str, Any]) -> tuple[int, int]:
    cols, rows = arg_int(h, "cols", PTY_COLS, lo=1), arg_int(h, "rows", PTY_ROWS, lo=1)
    if cols > PTY_MAX_DIM or rows > PTY_MAX_DIM:
        raise OpError("EINVAL", f"'cols' and 'rows' must be at most {PTY_MAX_DIM}")
    return cols, rows


def login_shell(user: User | None) -> str:
    """The passwd shell of `user` (of the agent's own user without one), if it exists."""
    try:
        shell = pwd.getpwuid(user.uid if user is not None else os.getuid()).pw_shell
    except KeyError:
        shell = ""
    if shell and os.access(shell, os.X_OK) and not shell.endswith(("nologin", "false")):
        return shell
    return FALLBACK_SHELL


class PtyProcess(ManagedProcess):
    def __init__(self, popen: subprocess.Popen[bytes], display: str, **kw: Any) -> None:
        super().__init__(popen, display, background=True, **kw)
        self._rings["stdout"] = RingBuffer(PTY_RING_BYTES)

    def resize(self, cols: int, rows: int) -> None:
        with self._stdin_lock:
            pipe = self.popen.stdin
            if pipe is not None:
                set_winsize(pipe.fileno(), cols, rows)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "tty": True}


def _live_ptys(table: ProcessTable) -> int:
    return sum(1 for p in table.list() if p.get("tty") and p.get("running"))


def start(table: ProcessTable, h: dict[str, Any]) -> PtyProcess:
    """Start the PTY process a ``pty`` request asks for. Raises OpError or OSError."""
    cols, rows = _dims(h)
    user = _user(h)
    if h.get("cmd") is None and h.get("argv") is None:
        shell = login_shell(user)
        argv, display = [shell], shell
    else:
        argv, display = _command(h)
    cwd = arg_opt_str(h, "cwd")
    if _live_ptys(table) >= MAX_PTYS:
        raise OpError("EAGAIN", f"{MAX_PTYS} terminals are open already")
    env = dict(DEFAULT_ENV)
    env["TERM"] = DEFAULT_TERM
    ids: dict[str, Any] = {}
    if user is not None:
        env.update(user_env(user))
        ids = {"user": user.uid, "group": user.gid, "extra_groups": list(user.groups)}
    env["SHELL"] = login_shell(user)
    env.update(_env(h) or {})
    master, slave = os.openpty()
    try:
        set_winsize(master, cols, rows)
        if user is not None:
            os.fchown(slave, user.uid, -1)  # the user's terminal, as login(1) leaves it
        t0 = time.monotonic()

        def spawn() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                cwd=cwd if cwd is not None else table.default_cwd, start_new_session=True,
                preexec_fn=_take_ctty, close_fds=True, bufsize=0, **ids)

        leaf: str | None = None
        if table.cgroups is not None:
            popen, leaf = table.cgroups.spawn_in_leaf(spawn)
        else:
            popen = spawn()
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)
    # The I/O loop reads the master as the process's stdout and writes keystrokes to a
    # second descriptor of it as stdin: closing one (the process ended) leaves the other.
    popen.stdout = os.fdopen(master, "rb", buffering=0)
    popen.stdin = os.fdopen(os.dup(master), "wb", buffering=0)
    proc = PtyProcess(popen, display, cgroups=table.cgroups, leaf=leaf, started=t0)
    table.adopt(proc)
    return proc


def pty(table: ProcessTable, op: Op, f: Frame) -> None:
    try:
        proc = start(table, f.header)
    except FileNotFoundError as e:
        raise OpError("ENOENT", f"{e.filename}: {e.strerror}",
                      e.filename if isinstance(e.filename, str) else None) from None
    op.send("spawned", pid=proc.pid)
    threading.Thread(target=proc.run_io, name=f"pty-{proc.pid}", daemon=True).start()


def attach(table: ProcessTable, op: Op, f: Frame) -> None:
    """``attached``, the ring, then live output as ``stdout`` frames, then ``exit``;
    meanwhile the host sends ``stdin`` (credit-controlled keystrokes) and ``resize {cols,
    rows}`` on this id. A cancel detaches; the process runs on."""
    proc = _proc(table, f.header)
    if not isinstance(proc, PtyProcess):
        raise OpError("EINVAL", f"process {proc.pid} has no terminal")
    keys: queue.SimpleQueue[bytes | tuple[int, int] | None] = queue.SimpleQueue()

    def on_stream_frame(fr: Frame) -> None:
        if fr.t == "stdin":
            keys.put(fr.payload)
        elif fr.t == "resize":
            # A bad resize is dropped: the terminal keeps its size.
            with contextlib.suppress(OpError):
                keys.put(_dims(fr.header))

    def on_cancel(o: Op) -> None:
        keys.put(None)
        o.release()

    sink = _Sink(op, keys)
    op.set_handlers(on_stream_frame, on_cancel)
    threading.Thread(target=_writer, args=(op, proc, keys), name=f"pty-in-{proc.pid}",
                     daemon=True).start()
    with sink.lock:
        out, _err, info = proc.attach(sink)
        if info is None:
            op.keep = True
        op.send("attached", pid=proc.pid)
        if out and not op.send_data("stdout", out):
            return
        if info is not None:
            op.send("exit", **info)
            keys.put(None)


class _Sink(WireSink):
    """Ends the attachment's writer thread with the process (or the detach)."""

    def __init__(self, op: Op, keys: queue.SimpleQueue[bytes | tuple[int, int] | None]) -> None:
        super().__init__(op)
        self._keys = keys

    def finish(self, info: dict[str, Any]) -> None:
        super().finish(info)
        self._keys.put(None)


def _writer(op: Op, proc: PtyProcess,
            keys: queue.SimpleQueue[bytes | tuple[int, int] | None]) -> None:
    """Keystrokes and resizes in the order they came (a write to the master can block while
    the terminal's input queue is full: here, never in the agent's reader)."""
    while (item := keys.get()) is not None:
        try:
            if isinstance(item, tuple):
                proc.resize(*item)
            else:
                proc.write_stdin(item)
        except OSError:
            pass  # the terminal is gone (the process ended): keep granting until detached
        if isinstance(item, bytes):
            op.consumed(len(item))


#: The requests this module answers (the agent's dispatch table is made of these).
HANDLERS: dict[str, Handler] = {
    "pty": lambda a, op, f: pty(a.procs, op, f),
    "pty_attach": lambda a, op, f: attach(a.procs, op, f),
}
