"""Snapshots of running sandboxes: memory + device state in one stream, disk as shared layers.

A sandbox disk is a chain of copy-on-write layers named `layer-<id><suffix>` (the driver's
`DiskLayers` format and suffix). The oldest backs onto the template disk by absolute path; every
later one names its parent *relatively*. A directory that holds hard links to every layer of a
chain can therefore open it, wherever it is. A snapshot
directory links the frozen layers of its source; a sandbox restored from it links the same
layers into its own directory and adds an empty top layer. Deleting a snapshot only drops links:
a layer lives until the last sandbox or snapshot that uses it is gone, and nothing is copied.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import time
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path

from pandastack.host.images.common import fsync_path
from pandastack.hostport.errors import SnapshotNotFound
from pandastack.hostport.results import SnapshotInfo

SNAPSHOT_ID_RE = re.compile(r"^snap-[0-9a-f]{12}$")
STREAM = "state.stream"
META = "snapshot.json"


def allocated_bytes(directory: Path) -> int:
    """Bytes allocated on disk by the regular files of `directory` (hard links count in full;
    a symbolic link, such as a stream in the fork buffer, counts nothing)."""
    total = 0
    for entry in directory.iterdir():
        try:
            st = entry.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode):
            total += st.st_blocks * 512
    return total


def out_of_space(exc: BaseException, directory: Path, needed_bytes: int) -> bool:
    """Whether a failed write into `directory` most likely ran out of space: ENOSPC/EDQUOT
    somewhere in the exception chain, or less free space left there than `needed_bytes`
    (a VMM may report a failed stream without the errno of the writer)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    try:
        st = os.statvfs(directory)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < needed_bytes


def new_layer_name(suffix: str) -> str:
    """A fresh layer file name; `suffix` is the driver's (`DiskLayers.suffix`)."""
    return f"layer-{secrets.token_hex(6)}{suffix}"


def link_layers(src_dir: Path, dst_dir: Path, names: Iterable[str]) -> None:
    """Make every named layer of `src_dir` available in `dst_dir`, without copying data."""
    for name in names:
        dst = dst_dir / name
        if dst.exists():
            continue
        try:
            os.link(src_dir / name, dst)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            # Another filesystem: a reflink where the filesystem has them, else a copy.
            subprocess.run(["cp", "--reflink=auto", "--sparse=always", str(src_dir / name),
                            str(dst)], check=True)


def _try_lock(directory: Path) -> int | None:
    """An open descriptor of `directory` holding an exclusive flock on it, or None if
    another open description (of any process) holds one, or the directory is gone."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


class SnapshotStore:
    """A snapshots directory. Several runtimes may share one (its default is under
    PANDASTACK_HOME, whatever their state dirs), so a transient snapshot is flocked by the
    fork that makes it until it is deleted: the sweep at another runtime's start tells a
    fork under way (locked) from one a crash cut short (the lock went with its process)."""

    def __init__(self, root: Path, *, durable: bool = True):
        self.root = root
        self.durable = durable
        self._holds: dict[str, int] = {}  # snapshot id -> the descriptor holding its flock

    def path(self, snapshot_id: str) -> Path:
        if not SNAPSHOT_ID_RE.match(snapshot_id):
            raise SnapshotNotFound(snapshot_id)
        return self.root / snapshot_id

    def new_id(self) -> str:
        return f"snap-{secrets.token_hex(6)}"

    def begin(self, snapshot_id: str, *, hold: bool = False) -> Path:
        """The work directory of a new snapshot; `hold`: locked from now until `delete` or
        `abort` (the lock follows the directory when `commit` renames it), so no `sweep`
        removes it meanwhile."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        work = self.root / f".tmp-{snapshot_id}"
        work.mkdir(mode=0o700)  # the stream is the guest's memory
        if hold:
            fd = _try_lock(work)
            if fd is None:  # nobody else knows this directory yet
                shutil.rmtree(work, ignore_errors=True)
                raise OSError(errno.EBUSY, f"cannot lock {work}")
            self._holds[snapshot_id] = fd
        return work

    def abort(self, work: Path) -> None:
        shutil.rmtree(work, ignore_errors=True)
        self._release(work.name.removeprefix(".tmp-"))

    def _release(self, snapshot_id: str) -> None:
        fd = self._holds.pop(snapshot_id, None)
        if fd is not None:
            os.close(fd)

    def release_all(self) -> None:
        for snapshot_id in list(self._holds):
            self._release(snapshot_id)

    def commit(self, work: Path, info: SnapshotInfo) -> None:
        meta = work / META
        with open(os.open(meta, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(json.dumps(asdict(info)))
        if not info.internal and self.durable:
            for part in (STREAM, META):
                fsync_path(work / part)
        os.replace(work, self.path(info.id))

    def get(self, snapshot_id: str) -> SnapshotInfo:
        try:
            data = json.loads((self.path(snapshot_id) / META).read_text())
        except (OSError, ValueError) as exc:
            raise SnapshotNotFound(snapshot_id) from exc
        data["layers"] = tuple(data["layers"])
        data["volumes"] = tuple(data.get("volumes", ()))
        return SnapshotInfo(**data)

    def stream(self, snapshot_id: str) -> Path:
        return self.path(snapshot_id) / STREAM

    def all(self, *, include_internal: bool = False) -> list[SnapshotInfo]:
        found = []
        for entry in sorted(self.root.glob("snap-*")) if self.root.exists() else []:
            try:
                info = self.get(entry.name)
            except SnapshotNotFound:
                continue
            if include_internal or not info.internal:
                found.append(info)
        return sorted(found, key=lambda i: i.created_at)

    def delete(self, snapshot_id: str) -> None:
        """Remove the snapshot; sandboxes restored from it keep their own links to its layers."""
        path = self.path(snapshot_id)
        try:
            if not path.exists():
                raise SnapshotNotFound(snapshot_id)
            shutil.rmtree(path)
        finally:
            self._release(snapshot_id)

    def template_paths(self) -> list[Path]:
        return [Path(info.template_path) for info in self.all(include_internal=True)]

    def sweep(self, max_age_s: float = 3600.0) -> None:
        """Remove what a crash left: half-written snapshots older than `max_age_s`, and the
        transient snapshots of forks that were under way. A transient snapshot still locked
        is a fork under way, of another runtime that shares this directory: left alone."""
        for info in self.all(include_internal=True):
            if not info.transient or info.id in self._holds:
                continue
            fd = _try_lock(self.path(info.id))
            if fd is None:
                continue
            try:
                shutil.rmtree(self.path(info.id), ignore_errors=True)
            finally:
                os.close(fd)
        now = time.time()
        for entry in self.root.glob(".tmp-snap-*") if self.root.exists() else []:
            try:
                if now - entry.stat().st_mtime > max_age_s:
                    shutil.rmtree(entry, ignore_errors=True)
            except FileNotFoundError:
                continue
