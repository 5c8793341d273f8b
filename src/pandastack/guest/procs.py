"""Managed processes: spawning in a fresh session (and cgroup), output pumping, exit, kill.

Every exec/spawn becomes a ``ManagedProcess``. One I/O loop per process (run by the
exec op's own thread, or by a thread of its own for spawn) polls stdout, stderr and a
pidfd. Output goes into a capped ring buffer per stream and to the attached sinks; a
sink that has no credit blocks the loop, which blocks the pipe, which blocks the
process (plain pipe backpressure). With no sink attached output only fills the ring.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import heapq
import itertools
import logging
import os
import pwd
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .cgroups import Cgroups

log = logging.getLogger("pandastack_guest")

RING_BYTES = 1 << 20
READ_SIZE = 64 * 1024
EXIT_GRACE = 1.0
"""After the main process exited, how long to wait for descendants to close its pipes."""
KILLED_GRACE = 10.0
"""The same once its cgroup was killed: every descendant is dying, but a thousand of them
(a fork bomb) take a few seconds to exit on one TCG vCPU; the exit is reported once they
have, so the next exec does not meet them (nor a pids limit they still hold)."""
MAX_FINISHED = 64
WAIT_MAX = 86400.0
"""Longest single wait of the watchdog (it waits again for a deadline further away)."""

DEFAULT_ENV = {
    # /opt/venv (see the image) comes first: `pip install` and `python` use the sandbox's
    # virtualenv, which sees the system's packages too.
    "PATH": "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "VIRTUAL_ENV": "/opt/venv",
    "HOME": "/root",
    "LANG": "C.UTF-8",
}


MAX_ID = 2**31 - 2
"""The highest uid or gid a spec may name as a number (Docker's bound)."""


@dataclass(frozen=True)
class User:
    """Who a process runs as (resolved from the passwd and group databases before
    spawning). `name` is empty for a uid without a passwd entry: no USER or LOGNAME then."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str


def user_env(user: User) -> dict[str, str]:
    """HOME, USER and LOGNAME of a user (HOME only for a bare uid, as Docker sets)."""
    if not user.name:
        return {"HOME": user.home}
    return {"HOME": user.home, "USER": user.name, "LOGNAME": user.name}


class UnknownId(LookupError):
    """A user name (or group name) the guest's passwd (group) database lacks."""


def _number(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() and int(text) <= MAX_ID else None


def lookup_user(spec: str) -> User:
    """Who `spec` names, as Docker reads a USER: `user` or `user:group`, each a name or a
    number. A user name or a uid with a passwd entry takes the entry's home, primary group
    and memberships; a bare uid without one is that uid with HOME=/ and gid 0. A group (a
    name from the group database, or any gid) replaces the gid, without the memberships
    (as Docker does). UnknownId says which name is missing."""
    name, sep, group = spec.partition(":")
    number = _number(name)
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        pw = None
        if number is not None:
            with contextlib.suppress(KeyError):
                pw = pwd.getpwuid(number)
    if pw is not None:
        user = User(pw.pw_name, pw.pw_uid, pw.pw_gid,
                    tuple(os.getgrouplist(pw.pw_name, pw.pw_gid)), pw.pw_dir)
    elif number is not None:
        user = User("", number, 0, (), "/")
    else:
        raise UnknownId(f"no such user: {name!r}")
    if not sep:
        return user
    gid = _number(group)
    if gid is None:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise UnknownId(f"no such group: {group!r}") from None
    return User(user.name, user.uid, gid, (), user.home)


class Sink(Protocol):
    """Receives one process's output; ``deliver`` may block (flow control)."""

    @property
    def closed(self) -> bool: ...

    def deliver(self, stream: str, data: bytes) -> None: ...

    def finish(self, info: dict[str, Any]) -> None: ...


class RingBuffer:
    def __init__(self, cap: int = RING_BYTES) -> None:
        self.cap = cap
        self._buf = bytearray()
        self.dropped = 0

    def append(self, data: bytes) -> None:
        self._buf += data
        over = len(self._buf) - self.cap
        if over > 0:
            del self._buf[:over]
            self.dropped += over

    def get(self) -> bytes:
        return bytes(self._buf)


class Watchdog:
    """One thread for all deadlines; it sleeps (blocking) until the nearest one."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._cancelled: set[int] = set()
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def schedule(self, delay: float, fn: Callable[[], None]) -> int:
        with self._cond:
            key = next(self._seq)
            heapq.heappush(self._heap, (time.monotonic() + delay, key, fn))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)
                self._thread.start()
            self._cond.notify()
            return key

    def cancel(self, key: int) -> None:
        with self._cond:
            if any(k == key for _, k, _ in self._heap):
                self._cancelled.add(key)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                when, key, fn = self._heap[0]
                left = when - time.monotonic()
                if left > 0:
                    # Bounded: a timeout_ms near 2**64 is past what a timed wait takes, and
                    # the OverflowError would end this thread (and every later timeout).
                    self._cond.wait(min(left, WAIT_MAX))
                    continue
                heapq.heappop(self._heap)
                if key in self._cancelled:
                    self._cancelled.discard(key)
                    continue
            try:
                fn()
            except Exception:  # never let a callback kill the watchdog
                log.exception("watchdog callback")


def exit_info(returncode: int) -> tuple[int, int | None]:
    if returncode < 0:
        return 128 - returncode, -returncode
    return returncode, None


class ManagedProcess:
    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        display: str,
        *,
        background: bool,
        cgroups: Cgroups | None,
        leaf: str | None,
        started: float,
    ) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.display = display
        self.background = background
        self.started_wall = time.time()
        self._cgroups = cgroups
        self._leaf = leaf
        # The leaf goes back to the cgroup pool (and to the next exec) when this tree ends:
        # a kill after that must not reach it, so both take this lock.
        self._leaf_lock = threading.Lock()
        self._leaf_killed = False
        self._t0 = started
        self._lock = threading.Lock()
        self._stdin_lock = threading.Lock()
        self._sinks: list[Sink] = []
        self._rings = {"stdout": RingBuffer(), "stderr": RingBuffer()}
        self.info: dict[str, Any] | None = None
        self.timed_out = False
        self.done = threading.Event()
        self._watch_key: int | None = None
        self.on_finished: Callable[[ManagedProcess], None] | None = None

    # -- control ------------------------------------------------------------------
    def kill_tree(self, sig: int = signal.SIGKILL) -> None:
        if sig == signal.SIGKILL and self._cgroups is not None:
            with self._leaf_lock:
                if self._leaf is not None:
                    self._cgroups.kill(self._leaf)
                    self._leaf_killed = True
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            pass

    def timeout_expired(self) -> None:
        if self.info is None:
            self.timed_out = True
            self.kill_tree()

    def set_timeout(self, watchdog: Watchdog, seconds: float) -> None:
        self._watch_key = watchdog.schedule(seconds, self.timeout_expired)
        self._watchdog = watchdog

    def write_stdin(self, data: bytes) -> None:
        """Blocking write to the process's stdin pipe (OSError if closed / gone)."""
        with self._stdin_lock:
            pipe = self.popen.stdin
            if pipe is None:
                raise BrokenPipeError(32, "stdin is closed")
            fd = pipe.fileno()
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]

    def write_stdin_within(self, data: bytes, seconds: float) -> None:
        """Write to the stdin pipe, waiting at most `seconds` for the process to make room:
        EAGAIN past that (how much went in is in the message), so that a process that never
        reads its stdin does not hold the request, and a thread of this agent, forever."""
        with self._stdin_lock:
            pipe = self.popen.stdin
            if pipe is None:
                raise BrokenPipeError(32, "stdin is closed")
            fd = pipe.fileno()
            view = memoryview(data)
            deadline = time.monotonic() + seconds
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
            os.set_blocking(fd, False)
            try:
                while view:
                    left = deadline - time.monotonic()
                    if left <= 0 or not poller.poll(left * 1000):
                        raise BlockingIOError(
                            errno.EAGAIN, f"the process has not read its stdin for "
                            f"{seconds:.0f} s ({len(data) - len(view)} of {len(data)} "
                            "bytes written)")
                    try:
                        view = view[os.write(fd, view):]
                    except BlockingIOError:
                        continue
            finally:
                with contextlib.suppress(OSError):
                    os.set_blocking(fd, True)

    def close_stdin(self) -> None:
        with self._stdin_lock:
            pipe = self.popen.stdin
            self.popen.stdin = None
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()

    # -- sinks --------------------------------------------------------------------
    def add_sink(self, sink: Sink) -> None:
        with self._lock:
            self._sinks.append(sink)

    def attach(self, sink: Sink) -> tuple[bytes, bytes, dict[str, Any] | None]:
        """Register ``sink`` (unless already exited) and return the backlog atomically.

        The caller must hold the sink's own delivery lock while calling this and while
        sending the backlog, so live output cannot overtake the backlog.
        """
        out, err, info, _ = self.attach_counted(sink)
        return out, err, info

    def attach_counted(
        self, sink: Sink
    ) -> tuple[bytes, bytes, dict[str, Any] | None, dict[str, int]]:
        """``attach``, plus how many bytes of each stream the rings had already lost (taken
        under the same lock, so the count is exact for the backlog returned)."""
        with self._lock:
            out, err = self._rings["stdout"].get(), self._rings["stderr"].get()
            dropped = {name: ring.dropped for name, ring in self._rings.items()}
            if self.info is None:
                self._sinks.append(sink)
            return out, err, self.info, dropped

    def detach_all(self) -> None:
        with self._lock:
            self._sinks = []

    def _emit(self, stream: str, data: bytes) -> None:
        with self._lock:
            self._rings[stream].append(data)
            sinks = self._sinks
        dead = False
        for s in sinks:
            if s.closed:
                dead = True
                continue
            s.deliver(stream, data)
            dead = dead or s.closed
        if dead:
            with self._lock:
                self._sinks = [s for s in self._sinks if not s.closed]

    # -- the I/O loop -------------------------------------------------------------
    def run_io(self) -> None:
        poller = select.poll()
        fds: dict[int, str] = {}
        for name, pipe in (("stdout", self.popen.stdout), ("stderr", self.popen.stderr)):
            if pipe is not None:
                fds[pipe.fileno()] = name
                poller.register(pipe.fileno(), select.POLLIN)
        exit_fd, waiter = self._exit_fd()
        poller.register(exit_fd, select.POLLIN)
        exited_at: float | None = None
        try:
            while fds or exited_at is None:
                timeout: float | None = None
                if exited_at is not None:
                    grace = KILLED_GRACE if self._leaf_killed else EXIT_GRACE
                    left = exited_at + grace - time.monotonic()
                    if left <= 0:
                        break
                    timeout = left * 1000
                for fd, _ev in poller.poll(timeout):
                    if fd == exit_fd:
                        poller.unregister(exit_fd)
                        self.popen.wait()
                        exited_at = time.monotonic()
                        continue
                    stream = fds.get(fd)
                    if stream is None:
                        continue
                    try:
                        data = os.read(fd, READ_SIZE)
                    except OSError:
                        data = b""
                    if data:
                        self._emit(stream, data)
                    else:
                        poller.unregister(fd)
                        del fds[fd]
            self._await_killed_tree(exited_at + KILLED_GRACE)
            if not fds:
                # Reaped, and nothing holds its pipes: the tree has left its leaf (a descendant
                # that let go of them keeps it, and release() lists it as stale). Back in the
                # pool before the exit goes out, so the exec a caller sends on seeing that exit
                # finds it spare (issue 33).
                self._release_leaf()
            self._finish(exited_at)
            # Descendants still hold the pipes: keep draining into the ring until EOF,
            # so they never get SIGPIPE. Nothing is sent any more.
            while fds:
                for fd, _ev in poller.poll():
                    try:
                        data = os.read(fd, READ_SIZE)
                    except OSError:
                        data = b""
                    if data:
                        with self._lock:
                            self._rings[fds[fd]].append(data)
                    else:
                        poller.unregister(fd)
                        del fds[fd]
        finally:
            os.close(exit_fd)
            if waiter is not None:
                waiter.join()
            for pipe in (self.popen.stdout, self.popen.stderr):
                if pipe is not None:
                    pipe.close()
            self.close_stdin()
            self._release_leaf()

    def _release_leaf(self) -> None:
        with self._leaf_lock:
            leaf, self._leaf = self._leaf, None
        if leaf is not None and self._cgroups is not None:
            self._cgroups.release(leaf)

    def _await_killed_tree(self, deadline: float) -> None:
        with self._leaf_lock:
            leaf = self._leaf if self._leaf_killed else None
        if leaf is not None and self._cgroups is not None:
            self._cgroups.wait_empty(leaf, deadline)

    def _exit_fd(self) -> tuple[int, threading.Thread | None]:
        """A fd that becomes readable when the process exits: pidfd, else a waiter pipe."""
        try:
            return os.pidfd_open(self.pid), None
        except (AttributeError, OSError):
            r, w = os.pipe2(os.O_CLOEXEC)

            def wait() -> None:
                self.popen.wait()
                os.write(w, b"x")
                os.close(w)

            t = threading.Thread(target=wait, name=f"wait-{self.pid}", daemon=True)
            t.start()
            return r, t

    def _finish(self, exited_at: float | None) -> None:
        rc = self.popen.returncode
        assert rc is not None
        code, sig = exit_info(rc)
        end = exited_at if exited_at is not None else time.monotonic()
        info: dict[str, Any] = {
            "code": code,
            "signal": sig,
            "timed_out": self.timed_out,
            "duration_ms": round((end - self._t0) * 1000, 3),
        }
        if self._watch_key is not None:
            self._watchdog.cancel(self._watch_key)
        with self._lock:
            self.info = info
            sinks, self._sinks = self._sinks, []
        for s in sinks:
            if not s.closed:
                s.finish(info)
        self.done.set()
        if self.on_finished is not None:
            self.on_finished(self)

    def describe(self) -> dict[str, Any]:
        info = self.info
        return {
            "pid": self.pid,
            "cmd": self.display[:256],
            "running": info is None,
            "background": self.background,
            "exit_code": None if info is None else info["code"],
            "signal": None if info is None else info["signal"],
            "timed_out": self.timed_out,
            "started": self.started_wall,
        }


class ProcessTable:
    """Spawns processes and remembers the running ones and the last finished background ones."""

    def __init__(self, cgroups: Cgroups | None, default_cwd: str | None = None) -> None:
        self.cgroups = cgroups
        self.default_cwd = default_cwd
        self.watchdog = Watchdog()
        self._lock = threading.Lock()
        self._procs: dict[int, ManagedProcess] = {}
        self._finished: list[ManagedProcess] = []

    def start(
        self,
        argv: Sequence[str],
        *,
        display: str,
        env: Mapping[str, str] | None,
        cwd: str | None,
        stdin: bool,
        background: bool,
        timeout: float | None,
        user: User | None = None,
    ) -> ManagedProcess:
        """Start a process in a new session (and cgroup leaf), as `user` if given (the child
        sets its groups, gid and uid before exec). Raises OSError."""
        full_env = dict(DEFAULT_ENV)
        ids: dict[str, Any] = {}
        if user is not None:
            full_env.update(user_env(user))
            ids = {"user": user.uid, "group": user.gid, "extra_groups": list(user.groups)}
        if env:
            full_env.update(env)
        t0 = time.monotonic()

        def spawn() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=full_env,
                cwd=cwd if cwd is not None else self.default_cwd,
                start_new_session=True,
                close_fds=True,
                bufsize=0,
                **ids,
            )

        leaf: str | None = None
        if self.cgroups is not None:
            popen, leaf = self.cgroups.spawn_in_leaf(spawn)
        else:
            popen = spawn()
        proc = ManagedProcess(
            popen, display, background=background, cgroups=self.cgroups, leaf=leaf, started=t0
        )
        proc.on_finished = self._finished_cb
        with self._lock:
            self._procs[proc.pid] = proc
        if timeout is not None:
            proc.set_timeout(self.watchdog, timeout)
        return proc

    def adopt(self, proc: ManagedProcess) -> None:
        """Remember a process started elsewhere (a terminal's, guest/pty.py) like our own."""
        proc.on_finished = self._finished_cb
        with self._lock:
            self._procs[proc.pid] = proc

    def _finished_cb(self, proc: ManagedProcess) -> None:
        with self._lock:
            if not proc.background:
                self._procs.pop(proc.pid, None)
                return
            if proc not in self._finished:
                self._finished.append(proc)
            while len(self._finished) > MAX_FINISHED:
                old = self._finished.pop(0)
                if self._procs.get(old.pid) is old:
                    del self._procs[old.pid]

    def get(self, pid: int) -> ManagedProcess | None:
        with self._lock:
            return self._procs.get(pid)

    def to_background(self, proc: ManagedProcess) -> None:
        """A foreground exec lost its host: keep it (and its output) as a background one."""
        with self._lock:
            if proc.background:
                return
            proc.background = True
            if proc.info is not None and proc not in self._finished:
                self._procs[proc.pid] = proc
                self._finished.append(proc)

    def kill_all(self) -> None:
        with self._lock:
            procs = [p for p in self._procs.values() if p.info is None]
        for p in procs:
            p.kill_tree()

    def list(self) -> list[dict[str, Any]]:
        with self._lock:
            procs = list(self._procs.values())
        return [p.describe() for p in procs]
