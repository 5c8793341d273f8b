"""Process operations: exec, spawn, spawn_attach, attach, procs, signal, stdin, stdin_eof."""

from __future__ import annotations

import json
import os
import queue
import shlex
import signal as signal_mod
import threading
from typing import Any

from pandastack.guestproto.frames import Frame
from pandastack.guestproto.ops import MAX_SIGNAL

from .ops import Handler, Op, OpError, arg_bool, arg_int, arg_opt_int, arg_opt_str
from .procs import ManagedProcess, ProcessTable, UnknownId, User, lookup_user

MAX_PROC_LIST = 900 * 1024


class WireSink:
    """Delivers a process's output as ``stdout``/``stderr`` frames of one op, then ``exit``."""

    def __init__(self, op: Op) -> None:
        self.op = op
        self.lock = threading.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed or self.op.cancelled.is_set()

    def deliver(self, stream: str, data: bytes) -> None:
        with self.lock:
            if not self.closed and not self.op.send_data(stream, data):
                self._closed = True

    def finish(self, info: dict[str, Any]) -> None:
        with self.lock:
            if not self.closed:
                self.op.send("exit", **info)
            self._closed = True
        self.op.release()


def _command(h: dict[str, Any]) -> tuple[list[str], str]:
    argv = h.get("argv")
    cmd = h.get("cmd")
    if argv is not None:
        if (
            not isinstance(argv, list)
            or not argv
            or not all(isinstance(a, str) and "\0" not in a for a in argv)
        ):
            raise OpError("EINVAL", "'argv' must be a non-empty list of strings")
        return list(argv), shlex.join(argv)
    if isinstance(cmd, str) and cmd and "\0" not in cmd:
        return ["/bin/sh", "-c", cmd], cmd
    raise OpError("EINVAL", "need 'cmd' (non-empty string) or 'argv' (list of strings)")


def _env(h: dict[str, Any]) -> dict[str, str] | None:
    env = h.get("env")
    if env is None:
        return None
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\0" not in k + v
        for k, v in env.items()
    ):
        raise OpError("EINVAL", "'env' must map names to strings")
    return env


def _user(h: dict[str, Any]) -> User | None:
    name = arg_opt_str(h, "user")
    if name is None:
        return None
    try:
        return lookup_user(name)
    except UnknownId as exc:
        raise OpError("EINVAL", str(exc)) from None
    except (OverflowError, ValueError):
        raise OpError("EINVAL", f"no such user: {name!r}") from None


def _start(
    table: ProcessTable, h: dict[str, Any], *, background: bool, stdin: bool
) -> tuple[ManagedProcess | None, int, str]:
    """Start the process. Returns (process, 0, "") or (None, exit code, message) for a
    program that cannot be run (argv form). A bad cwd raises."""
    argv, display = _command(h)
    cwd = arg_opt_str(h, "cwd")
    timeout_ms = arg_opt_int(h, "timeout_ms", lo=1)
    user = _user(h)
    try:
        proc = table.start(
            argv,
            display=display,
            env=_env(h),
            cwd=cwd,
            stdin=stdin,
            background=background,
            timeout=None if timeout_ms is None else timeout_ms / 1000,
            user=user,
        )
    except OSError as e:
        if e.filename is None or (cwd is not None and e.filename == cwd):
            raise  # not about the program (e.g. a bad cwd, out of fds): an error reply
        code = 127 if isinstance(e, FileNotFoundError) else 126
        why = "command not found" if code == 127 else (e.strerror or "cannot execute")
        return None, code, f"pandastack-agent: {argv[0]}: {why}\n"
    return proc, 0, ""


def exec_(table: ProcessTable, op: Op, f: Frame) -> None:
    h = f.header
    want_stdin = arg_bool(h, "stdin")
    proc, code, msg = _start(table, h, background=False, stdin=want_stdin)
    if proc is None:
        op.send_data("stderr", msg.encode())
        op.send("exit", code=code, signal=None, timed_out=False, duration_ms=0.0)
        return
    sink = WireSink(op)
    proc.add_sink(sink)
    stdin_q: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()

    def on_stream_frame(fr: Frame) -> None:
        if fr.t == "stdin":
            stdin_q.put(fr.payload)
        elif fr.t == "stdin_eof":
            stdin_q.put(None)
        elif fr.t == "signal":
            sig = fr.header.get("sig")
            if isinstance(sig, int) and 0 < sig < 65:
                proc.kill_tree(sig)

    def on_cancel(o: Op) -> None:
        stdin_q.put(None)
        if o.explicit_cancel:
            proc.kill_tree()
        else:
            table.to_background(proc)

    op.set_handlers(on_stream_frame, on_cancel)
    writer: threading.Thread | None = None
    if want_stdin:
        writer = threading.Thread(
            target=_stdin_writer, args=(op, proc, stdin_q), name=f"stdin-{proc.pid}", daemon=True
        )
        writer.start()
    try:
        proc.run_io()
    finally:
        stdin_q.put(None)


def _stdin_writer(op: Op, proc: ManagedProcess, q: queue.SimpleQueue[bytes | None]) -> None:
    broken = False
    while True:
        data = q.get()
        if data is None:
            break
        if not broken:
            try:
                proc.write_stdin(data)
            except OSError:
                broken = True  # the process closed stdin / exited: drop, keep granting
        op.consumed(len(data))
    proc.close_stdin()


def spawn(table: ProcessTable, op: Op, f: Frame) -> None:
    h = f.header
    proc, code, msg = _start(table, h, background=True, stdin=arg_bool(h, "stdin", True))
    if proc is None:
        raise OpError("ENOENT" if code == 127 else "EACCES", msg.strip())
    op.send("spawned", pid=proc.pid)
    threading.Thread(target=proc.run_io, name=f"proc-{proc.pid}", daemon=True).start()


def spawn_attach(table: ProcessTable, op: Op, f: Frame) -> None:
    """A background process, as `spawn` starts one, followed on this op as `attach` follows
    one: its pid first, then its output, then its exit. One round trip where a client that
    needs the pid before the output would otherwise make two; leaving the op only detaches."""
    h = f.header
    proc, code, msg = _start(table, h, background=True, stdin=arg_bool(h, "stdin", True))
    if proc is None:
        raise OpError("ENOENT" if code == 127 else "EACCES", msg.strip())
    # Its output loop has not run yet: the sink sees every byte, so there is no backlog.
    proc.add_sink(WireSink(op))
    op.set_handlers(lambda fr: None, lambda o: o.release())
    op.keep = True
    op.send("attached", pid=proc.pid)
    proc.run_io()


PID_MAX = 2**31 - 1
"""The largest pid_t: a bigger pid names no process (and overflows the system calls)."""


def _proc(table: ProcessTable, h: dict[str, Any]) -> ManagedProcess:
    pid = arg_int(h, "pid", lo=1)
    # Not quoted when out of range: the binary agent holds ints as i128 and could not say
    # the same number back (a host may send any int, up to thousands of digits).
    proc = table.get(pid) if pid <= PID_MAX else None
    if proc is None:
        raise OpError("ESRCH", f"no managed process {pid}" if pid <= PID_MAX
                      else "no managed process (pid out of range)")
    return proc


def attach(table: ProcessTable, op: Op, f: Frame) -> None:
    proc = _proc(table, f.header)
    sink = WireSink(op)
    op.set_handlers(lambda fr: None, lambda o: o.release())
    with sink.lock:
        out, err, info, dropped = proc.attach_counted(sink)
        if info is None:
            op.keep = True
        # First, so a client can tell a complete backlog from one the ring cut short.
        op.send("replay", stdout_dropped=dropped["stdout"], stderr_dropped=dropped["stderr"])
        if out and not op.send_data("stdout", out):
            return
        if err and not op.send_data("stderr", err):
            return
        if info is not None:
            op.send("exit", **info)


def procs(table: ProcessTable, op: Op, f: Frame) -> None:
    items = table.list()
    data = json.dumps(items).encode()
    while len(data) > MAX_PROC_LIST and items:
        items = items[len(items) // 4 + 1 :]
        data = json.dumps(items).encode()
    op.send("proc_list", data, count=len(items))


def signal(table: ProcessTable, op: Op, f: Frame) -> None:
    pid = arg_int(f.header, "pid", lo=1)
    sig = arg_int(f.header, "sig", lo=0)
    if sig > MAX_SIGNAL:
        raise OpError("EINVAL", "'sig' out of range")
    proc = table.get(pid)
    if proc is not None:
        if proc.info is None or sig == signal_mod.SIGKILL:
            proc.kill_tree(sig)
    elif pid > PID_MAX:
        raise OpError("ESRCH", "No such process")  # what kill(2) says, not an OverflowError
    else:
        os.kill(pid, sig)
    op.send("ok")


# A `stdin` by pid waits this long for the process to make room in its pipe (the host's
# answer deadline for the request is longer), then answers EAGAIN.
STDIN_WAIT_S = 10.0


def stdin(table: ProcessTable, op: Op, f: Frame) -> None:
    proc = _proc(table, f.header)
    if f.payload:
        proc.write_stdin_within(f.payload, STDIN_WAIT_S)
    op.send("ok")


def stdin_eof(table: ProcessTable, op: Op, f: Frame) -> None:
    _proc(table, f.header).close_stdin()
    op.send("ok")


#: The requests this module answers (the agent's dispatch table is made of these).
HANDLERS: dict[str, Handler] = {
    "exec": lambda a, op, f: exec_(a.procs, op, f),
    "spawn": lambda a, op, f: spawn(a.procs, op, f),
    "spawn_attach": lambda a, op, f: spawn_attach(a.procs, op, f),
    "attach": lambda a, op, f: attach(a.procs, op, f),
    "procs": lambda a, op, f: procs(a.procs, op, f),
    "signal": lambda a, op, f: signal(a.procs, op, f),
    "stdin": lambda a, op, f: stdin(a.procs, op, f),
    "stdin_eof": lambda a, op, f: stdin_eof(a.procs, op, f),
}
