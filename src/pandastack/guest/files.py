"""File operations: read_file, write_file, list, stat, mkdir, remove, rename, sync."""

from __future__ import annotations

import json
import os
import queue
import shutil
import stat as st
from typing import Any

from pandastack.guestproto.frames import MAX_CHUNK, Frame
from pandastack.guestproto.ops import WRITE_FILE_MODE

from .ops import Handler, Op, OpError, arg_bool, arg_int, arg_opt_int, arg_str

WRITE_IDLE_TIMEOUT = 300.0
"""A write_file whose host sends nothing for this long is abandoned (ETIMEDOUT)."""
LIST_FRAME_BYTES = 768 * 1024


def _type(mode: int) -> str:
    if st.S_ISREG(mode):
        return "file"
    if st.S_ISDIR(mode):
        return "dir"
    if st.S_ISLNK(mode):
        return "symlink"
    return "other"


def _info(name: str, path: str, s: os.stat_result) -> dict[str, Any]:
    return {
        "name": name,
        "path": path,
        "type": _type(s.st_mode),
        "size": s.st_size,
        "mode": st.S_IMODE(s.st_mode),
        "mtime": s.st_mtime,
    }


OFF_MAX = 2**63 - 1


def read_file(op: Op, f: Frame) -> None:
    h = f.header
    path = arg_str(h, "path")
    offset = arg_int(h, "offset", 0)
    length = arg_opt_int(h, "length")
    with open(path, "rb", buffering=0) as fh:
        s = os.fstat(fh.fileno())
        if st.S_ISDIR(s.st_mode):
            raise OpError("EISDIR", "Is a directory", path)
        if not op.send("file", size=s.st_size):
            return
        if offset > OFF_MAX:
            # lseek(2)'s answer to an offset past off_t, not an OverflowError.
            raise OpError("EINVAL", "Invalid argument", path)
        if offset:
            fh.seek(offset)
        sent = 0
        while length is None or sent < length:
            want = MAX_CHUNK if length is None else min(MAX_CHUNK, length - sent)
            n = op.credit.take(want)
            if n == 0 or op.cancelled.is_set():
                return
            data = fh.read(n)
            if len(data) < n:
                op.credit.add(n - len(data))
            if not data:
                break
            if not op.send("data", data):
                return
            sent += len(data)
        op.send("eof", size=sent)


def write_file(op: Op, f: Frame) -> None:
    h = f.header
    path = arg_str(h, "path")
    mode = arg_int(h, "mode", WRITE_FILE_MODE)
    if mode > 0o7777:
        raise OpError("EINVAL", "'mode' must be <= 0o7777")
    append = arg_bool(h, "append")
    try:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_APPEND if append else os.O_TRUNC)
        fd = os.open(path, flags, mode)
        try:
            os.fchmod(fd, mode)
            size = 0
            while True:
                try:
                    item = op.inbox.get(timeout=WRITE_IDLE_TIMEOUT)
                except queue.Empty:
                    raise OpError("ETIMEDOUT", "no data from host", path) from None
                if item is None:
                    return
                if item.t == "data":
                    view = memoryview(item.payload)
                    while view:
                        view = view[os.write(fd, view) :]
                    size += len(item.payload)
                    op.consumed(len(item.payload))
                elif item.t == "eof":
                    break
                else:
                    raise OpError("EPROTO", f"unexpected {item.t!r} in write_file", path)
        finally:
            os.close(fd)
    except OSError as e:
        if e.filename is None:
            e.filename = path
        raise
    op.send("written", size=size)


def list_dir(op: Op, f: Frame) -> None:
    path = arg_str(f.header, "path")
    batch: list[bytes] = []
    nbytes = 0
    with os.scandir(path) as it:
        for entry in it:
            try:
                s = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            item = json.dumps(_info(entry.name, os.path.join(path, entry.name), s)).encode()
            if nbytes + len(item) + 2 > LIST_FRAME_BYTES and batch:
                if not op.send("entries", b"[" + b",".join(batch) + b"]", more=True):
                    return
                batch, nbytes = [], 0
            batch.append(item)
            nbytes += len(item) + 1
    op.send("entries", b"[" + b",".join(batch) + b"]", more=False)


def stat(op: Op, f: Frame) -> None:
    path = arg_str(f.header, "path")
    follow = arg_bool(f.header, "follow", True)
    s = os.stat(path, follow_symlinks=follow)
    name = os.path.basename(path.rstrip("/")) or "/"
    op.send("info", **_info(name, path, s))


def mkdir(op: Op, f: Frame) -> None:
    path = arg_str(f.header, "path")
    if arg_bool(f.header, "parents", True):
        os.makedirs(path, exist_ok=True)
        if not os.path.isdir(path):
            raise OpError("EEXIST", "File exists", path)
    else:
        os.mkdir(path)
    op.send("ok")


def remove(op: Op, f: Frame) -> None:
    path = arg_str(f.header, "path")
    recursive = arg_bool(f.header, "recursive")
    if os.path.realpath(path) == "/":
        raise OpError("EINVAL", "refusing to remove /", path)
    s = os.lstat(path)
    if st.S_ISDIR(s.st_mode):
        if recursive:
            shutil.rmtree(path)
        else:
            os.rmdir(path)
    else:
        os.unlink(path)
    op.send("ok")


def rename(op: Op, f: Frame) -> None:
    os.rename(arg_str(f.header, "src"), arg_str(f.header, "dst"))
    op.send("ok")


def sync(op: Op, f: Frame) -> None:
    os.sync()
    op.send("ok")


#: The requests this module answers (the agent's dispatch table is made of these).
HANDLERS: dict[str, Handler] = {
    "read_file": lambda a, op, f: read_file(op, f),
    "write_file": lambda a, op, f: write_file(op, f),
    "list": lambda a, op, f: list_dir(op, f),
    "stat": lambda a, op, f: stat(op, f),
    "mkdir": lambda a, op, f: mkdir(op, f),
    "remove": lambda a, op, f: remove(op, f),
    "rename": lambda a, op, f: rename(op, f),
    "sync": lambda a, op, f: sync(op, f),
}
