"""The ``watch`` op: inotify on a directory (and, recursive, every directory under it).

Two threads per watch. The inotify reader decodes events as the kernel gives them, adds a
watch for each directory that appears (a recursive watch is one inotify watch per
directory) and appends to a bounded queue; the op's worker sends the queue as ``events``
frames under the op's credit. When the host reads slower than the guest writes, the queue
fills (MAX_QUEUED events) or the kernel's own queue overflows (IN_Q_OVERFLOW): either way
the watch ends with ``eof{reason:"overflow"}`` after the events queued before it, so what
the guest holds for a watch is bounded and the host learns that it lost events (it must
list again and start a new watch). See docs/adr/0029-file-watch.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import logging
import os
import select
import stat
import struct
import threading
from collections import deque
from typing import Any

from pandastack.guestproto.frames import MAX_CHUNK, WATCH_FRAME_CREDIT, Frame

from .ops import Handler, Op, OpError, arg_bool, arg_str

MAX_QUEUED = 10_000
"""Events a watch holds for a host that does not read; one more ends it in overflow."""
BATCH_BYTES = 64 * 1024
"""JSON bytes of one ``events`` frame (far below MAX_CHUNK: a batch goes out as it is)."""
MAX_WATCHES = 65_536
"""Directories one recursive watch follows; past it (or the kernel's per-user limit) events
would go unseen, so the watch ends in overflow as when its queue fills."""
PAIR_WAIT = 0.01
"""How long an IN_MOVED_FROM waits for its IN_MOVED_TO before it counts as a remove."""

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_UNMOUNT = 0x2000
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x1000000
IN_DONT_FOLLOW = 0x2000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
MASK = (IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
        | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW)
EVENT = struct.Struct("iIII")

log = logging.getLogger("pandastack_guest")

_libc: Any = None


def _inotify() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


def _oserror(path: str | None = None) -> OSError:
    e = ctypes.get_errno()
    return OSError(e, os.strerror(e), path)


class Watcher:
    """One inotify instance and the directories it follows; ``run`` is the reader thread."""

    def __init__(self, root: str, recursive: bool, max_queued: int = MAX_QUEUED) -> None:
        self.root = os.path.normpath(root)
        self.recursive = recursive
        self.max_queued = max_queued
        self.queue: deque[dict[str, Any]] = deque()
        self.end: str | None = None
        """Why the watch ended ("overflow", "removed", "unmounted", "stopped"), once it did."""
        self.cond = threading.Condition()
        self._libc = _inotify()
        self.fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            raise _oserror()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.paths: dict[int, str] = {}
        self._pending: tuple[int, str, bool] | None = None  # an IN_MOVED_FROM: cookie, path
        self._scanned: set[str] = set()
        """Paths a scan of a new directory told as created since the kernel's queue was last
        read empty: made between the directory's inotify_add_watch and its scan, an entry is
        also in that queue (its IN_CREATE), and must not be told twice."""
        try:
            if not stat.S_ISDIR(os.stat(self.root).st_mode):  # ENOENT & co. raise here
                raise OpError("ENOTDIR", "Not a directory (watch a directory)", self.root)
            self._add(self.root, report=False)
        except BaseException:
            self.close()
            raise

    # -- watches ----------------------------------------------------------------------
    def _add_one(self, path: str) -> bool:
        if len(self.paths) >= MAX_WATCHES:
            self._finish("overflow")  # what happens past the limit would go unseen
            return False
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), MASK)
        if wd < 0:
            err = _oserror(path)
            if path == self.root:
                raise err
            return False  # gone already, or not a directory any more: nothing to follow
        self.paths[wd] = path
        return True

    def _add(self, path: str, *, report: bool) -> None:
        """Follow ``path`` (and, recursive, the directories under it). With ``report``, what
        is already inside counts as created: it may have appeared before the watch did."""
        if not self._add_one(path) or not self.recursive:
            return
        stack = [path]
        while stack:
            d = stack.pop()
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue
            for entry in entries:
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    continue
                if report:
                    self._put({"type": "create", "path": entry.path, "is_dir": is_dir})
                    self._scanned.add(entry.path)
                if is_dir and self._add_one(entry.path):
                    stack.append(entry.path)

    def _unfollow(self, path: str) -> None:
        """A directory moved out of the tree: what happens in it is no longer ours."""
        for wd, p in list(self.paths.items()):
            if p == path or p.startswith(path + "/"):
                self._libc.inotify_rm_watch(self.fd, wd)
                del self.paths[wd]

    def _moved_dir(self, old: str, new: str) -> None:
        for wd, p in list(self.paths.items()):
            if p == old or p.startswith(old + "/"):
                self.paths[wd] = new + p[len(old):]

    # -- the queue --------------------------------------------------------------------
    def _put(self, ev: dict[str, Any]) -> None:
        with self.cond:
            if self.end is not None:
                return
            last = self.queue[-1] if self.queue else None
            if (ev["type"] == "write" and last is not None and last["type"] == "write"
                    and last["path"] == ev["path"]):
                return  # a run of writes to one file is one event
            if len(self.queue) >= self.max_queued:
                self.end = "overflow"
            else:
                self.queue.append(ev)
            self.cond.notify_all()

    def _finish(self, reason: str) -> None:
        with self.cond:
            if self.end is None:
                self.end = reason
            self.cond.notify_all()

    # -- reading ----------------------------------------------------------------------
    def run(self) -> None:
        try:
            while self.end is None:
                timeout = PAIR_WAIT if self._pending is not None else None
                ready, _, _ = select.select([self.fd, self._wake_r], [], [], timeout)
                if self._wake_r in ready:
                    return
                if not ready:
                    self._flush_pending()
                    continue
                try:
                    data = os.read(self.fd, 256 * 1024)
                except BlockingIOError:
                    continue
                self._decode(data)
                self._drain_after_scans()
        except Exception:  # events may be lost from here on: for the host, an overflow
            log.exception("watch of %s failed", self.root)
            self._finish("overflow")

    def _drain_after_scans(self) -> None:
        """Read on until the kernel's queue is empty, then forget what the scans told: an
        entry a scan saw was made before the scan read its directory, so its IN_CREATE (if
        the watch was there to see it) was queued before that empty read."""
        while self._scanned and self.end is None:
            try:
                data = os.read(self.fd, 256 * 1024)
            except BlockingIOError:
                self._scanned.clear()
                return
            self._decode(data)

    def _created(self, path: str, is_dir: bool) -> None:
        if path in self._scanned:  # told by the scan of its new directory, and followed
            self._scanned.discard(path)
            return
        self._put({"type": "create", "path": path, "is_dir": is_dir})
        if is_dir and self.recursive:
            self._add(path, report=True)

    def _flush_pending(self) -> None:
        if self._pending is not None:
            _, path, is_dir = self._pending
            self._pending = None
            if is_dir:
                self._unfollow(path)
            self._put({"type": "remove", "path": path, "is_dir": is_dir})

    def _decode(self, data: bytes) -> None:
        pos = 0
        while pos + EVENT.size <= len(data) and self.end is None:
            wd, mask, cookie, length = EVENT.unpack_from(data, pos)
            raw = data[pos + EVENT.size:pos + EVENT.size + length].rstrip(b"\0")
            pos += EVENT.size + length
            if mask & IN_Q_OVERFLOW:
                self._finish("overflow")
                return
            base = self.paths.get(wd)
            if base is None:
                continue
            is_dir = bool(mask & IN_ISDIR)
            path = os.path.join(base, os.fsdecode(raw)) if raw else base
            if self._pending is not None and not (mask & IN_MOVED_TO
                                                  and cookie == self._pending[0]):
                self._flush_pending()
            if mask & (IN_DELETE | IN_MOVED_FROM):
                self._scanned.discard(path)  # made again after this, it is a new create
            if mask & IN_MOVED_FROM:
                self._pending = (cookie, path, is_dir)
            elif mask & IN_MOVED_TO:
                if self._pending is not None:
                    old = self._pending[1]
                    self._pending = None
                    if is_dir:
                        self._moved_dir(old, path)
                    self._put({"type": "rename", "path": path, "old_path": old,
                               "is_dir": is_dir})
                else:
                    self._created(path, is_dir)
            elif mask & IN_CREATE:
                self._created(path, is_dir)
            elif mask & IN_MODIFY:
                self._put({"type": "write", "path": path, "is_dir": is_dir})
            elif mask & IN_ATTRIB:
                # a directory's own attribute change is told by its parent's watch
                if raw or base == self.root:
                    self._put({"type": "chmod", "path": path, "is_dir": is_dir})
            elif mask & IN_DELETE:
                self._put({"type": "remove", "path": path, "is_dir": is_dir})
            elif mask & (IN_DELETE_SELF | IN_MOVE_SELF) and base == self.root:
                self._finish("removed")
            elif mask & IN_UNMOUNT and base == self.root:
                self._finish("unmounted")
            elif mask & IN_IGNORED:
                del self.paths[wd]

    # -- the end ----------------------------------------------------------------------
    def stop(self) -> None:
        """Wake the reader and the sender (from any thread; never blocks)."""
        with contextlib.suppress(OSError):  # closed already, or the pipe is full: awake
            os.write(self._wake_w, b"x")
        self._finish("stopped")

    def close(self) -> None:
        for fd in (self.fd, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def take(self) -> tuple[list[bytes], str | None]:
        """Wait for events; return the next batch (JSON of each) or, once none are left,
        the reason the watch ended."""
        with self.cond:
            while not self.queue and self.end is None:
                self.cond.wait()
            batch: list[bytes] = []
            size = 2
            while self.queue:
                # ASCII JSON: a name that is not UTF-8 travels as \udcXX escapes
                item = json.dumps(self.queue[0], separators=(",", ":")).encode()
                if batch and size + len(item) + 1 > BATCH_BYTES:
                    break
                self.queue.popleft()
                if len(item) + 2 > MAX_CHUNK:
                    continue  # cannot happen with PATH_MAX paths; never break the frame
                batch.append(item)
                size += len(item) + 1
            return batch, (self.end if not batch else None)


def _take_credit(op: Op, n: int) -> bool:
    got = 0
    while got < n:
        k = op.credit.take(n - got)
        if k == 0 or op.cancelled.is_set():
            return False
        got += k
    return True


def watch(op: Op, f: Frame) -> None:
    path = arg_str(f.header, "path")
    recursive = arg_bool(f.header, "recursive", True)
    w = Watcher(path, recursive)
    reader = threading.Thread(target=w.run, name=f"watch-{op.id}", daemon=True)
    try:
        op.set_handlers(lambda _frame: None, lambda _op: w.stop())
        if not op.send("watching", path=w.root, recursive=recursive):
            return
        reader.start()
        while True:
            batch, end = w.take()
            if op.cancelled.is_set():
                return
            if end is not None:
                if end != "stopped":
                    op.send("eof", reason=end)
                return
            payload = b"[" + b",".join(batch) + b"]"
            cost = max(len(payload), WATCH_FRAME_CREDIT)
            if not _take_credit(op, cost) or not op.send("events", payload):
                return
    finally:
        w.stop()
        if reader.is_alive():
            reader.join(5)
        w.close()


#: The requests this module answers (the agent's dispatch table is made of these).
HANDLERS: dict[str, Handler] = {
    "watch": lambda a, op, f: watch(op, f),
}
