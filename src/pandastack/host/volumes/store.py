"""A host's volumes: one directory per volume under the volumes root, holding `disk.img` (a
sparse raw image with an ext4 file system on the whole disk, no partition table) and
`volume.json`.

Raw and whole-disk so that the VMM needs no format driver of its own and the host's e2fsprogs
work on the image directly (make, check, grow). A copy (a fork's or a snapshot's) is a sparse
copy: only the blocks the file system uses are read and written.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from pandastack.host.sparse import data_ranges
from pandastack.host.vmm.driver import pid_is_running
from pandastack.hostport.errors import VolumeInUse, VolumeNotFound
from pandastack.rules import MAX_VOLUME_MB, MIN_VOLUME_MB, VOLUME_ID_RE

IMAGE = "disk.img"
META = "volume.json"
MIB = 1 << 20
FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
# No reserved blocks (the volume is the tenant's), inode tables written now (a lazily
# initialised one is zeroed later by a kernel thread in the guest: guest CPU under TCG),
# the journal not zeroed (a new sparse file reads as zeros).
MKFS = ["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=0,lazy_journal_init=1"]


@dataclass(frozen=True)
class VolumeFiles:
    id: str
    size_bytes: int
    created_at: float
    source: str | None = None  # the volume this one is a copy of
    restored_from: str | None = None  # the backup it was made of (host/volumes/backup.py)

    @property
    def size_mb(self) -> int:
        return self.size_bytes // MIB


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode not in (0, 1) or (done.returncode == 1 and argv[0] != "e2fsck"):
        raise OSError(f"{what}: {' '.join(argv[:1])} exited {done.returncode}: "
                      f"{(done.stderr or done.stdout).strip()[-400:]}")


def check_size(size_mb: int) -> None:
    if not MIN_VOLUME_MB <= size_mb <= MAX_VOLUME_MB:
        raise ValueError(f"size_mb must be between {MIN_VOLUME_MB} and {MAX_VOLUME_MB}")


class VolumeStore:
    def __init__(self, root: Path):
        self.root = root

    def _dir(self, volume_id: str) -> Path:
        if not VOLUME_ID_RE.match(volume_id):
            raise VolumeNotFound(volume_id)
        return self.root / volume_id

    def image(self, volume_id: str) -> Path:
        path = self._dir(volume_id) / IMAGE
        if not (path.parent / META).exists():
            raise VolumeNotFound(volume_id)
        return path

    def get(self, volume_id: str) -> VolumeFiles:
        meta = self._dir(volume_id) / META
        try:
            data = json.loads(meta.read_text())
        except FileNotFoundError:
            raise VolumeNotFound(volume_id) from None
        return VolumeFiles(**data)

    def all(self) -> list[VolumeFiles]:
        if not self.root.is_dir():
            return []
        found = []
        for entry in sorted(self.root.iterdir()):
            if VOLUME_ID_RE.match(entry.name) and (entry / META).exists():
                found.append(self.get(entry.name))
        return found

    def _commit(self, work: Path, files: VolumeFiles) -> VolumeFiles:
        (work / META).write_text(json.dumps(asdict(files)))
        final = self.root / files.id
        if final.exists():
            shutil.rmtree(work, ignore_errors=True)
            raise VolumeInUse(f"volume {files.id} exists already")
        os.replace(work, final)
        return files

    def _work(self, volume_id: str) -> Path:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        work = self.root / f".{volume_id}.tmp-{os.getpid()}-{time.monotonic_ns()}"
        work.mkdir(mode=0o700)
        return work

    def begin(self, volume_id: str) -> Path:
        """A work directory for a volume made elsewhere (a restore): put its image in it
        as `IMAGE`, then `commit` or `abort` it."""
        self._dir(volume_id)
        return self._work(volume_id)

    def commit(self, work: Path, files: VolumeFiles) -> VolumeFiles:
        try:
            os.chmod(work / IMAGE, 0o600)
            return self._commit(work, files)
        except BaseException:
            self.abort(work)
            raise

    def abort(self, work: Path) -> None:
        shutil.rmtree(work, ignore_errors=True)

    def create(self, volume_id: str, size_mb: int) -> VolumeFiles:
        """A new empty ext4 volume (blocking: callers run it in a thread)."""
        check_size(size_mb)
        self._dir(volume_id)
        work = self._work(volume_id)
        try:
            image = work / IMAGE
            with open(image, "wb") as f:
                os.fchmod(f.fileno(), 0o600)
                f.truncate(size_mb * MIB)
            _run([*MKFS, "-L", volume_id[-12:], str(image)], "making the file system")
            return self._commit(work, VolumeFiles(volume_id, size_mb * MIB, time.time()))
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise

    def copy(self, source: Path, volume_id: str, size_bytes: int,
             source_id: str | None, *, take: bool = False) -> VolumeFiles:
        """A new volume holding a copy of image `source` (with `take`: `source` itself,
        moved, where it is on the same file system)."""
        self._dir(volume_id)
        work = self._work(volume_id)
        try:
            try:
                if not take:
                    raise OSError("a copy was asked for")
                os.replace(source, work / IMAGE)
            except OSError:  # or another file system (EXDEV)
                copy_image(source, work / IMAGE)
            return self._commit(work, VolumeFiles(volume_id, size_bytes, time.time(),
                                                  source=source_id))
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise

    def resize(self, volume_id: str, size_mb: int) -> VolumeFiles:
        """Grow a detached volume and its file system (the caller ensures it is detached)."""
        check_size(size_mb)
        files = self.get(volume_id)
        if size_mb * MIB < files.size_bytes:
            raise ValueError(f"a volume only grows: size_mb must be at least {files.size_mb}")
        image = self.image(volume_id)
        if size_mb * MIB > files.size_bytes:
            with open(image, "r+b") as f:
                f.truncate(size_mb * MIB)
            # resize2fs wants a checked file system; -p repairs what a VM killed mid-write
            # left (the journal is replayed) and nothing more.
            _run(["e2fsck", "-p", "-f", str(image)], "checking the file system")
            _run(["resize2fs", str(image)], "growing the file system")
        grown = replace(files, size_bytes=size_mb * MIB)
        (image.parent / META).write_text(json.dumps(asdict(grown)))
        return grown

    def delete(self, volume_id: str) -> None:
        path = self._dir(volume_id)
        if not path.exists():
            raise VolumeNotFound(volume_id)
        trash = self.root / f".{volume_id}.deleted-{time.monotonic_ns()}"
        os.replace(path, trash)
        shutil.rmtree(trash, ignore_errors=True)

    def sweep(self) -> None:
        """Remove what an interrupted create, copy or delete left: the work directories of
        processes that are gone (other runtimes on the machine may share the root)."""
        if not self.root.is_dir():
            return
        for entry in self.root.iterdir():
            if ".deleted-" in entry.name:
                shutil.rmtree(entry, ignore_errors=True)
            elif entry.name.startswith(".") and ".tmp-" in entry.name:
                pid = entry.name.split(".tmp-", 1)[1].split("-", 1)[0]
                if pid.isdigit() and not pid_is_running(int(pid)):
                    shutil.rmtree(entry, ignore_errors=True)


def copy_image(source: Path, dest: Path) -> None:
    """A reflink where the file system has them (XFS, btrfs: instant, blocks shared until
    written), else a sparse copy: holes stay holes (SEEK_DATA/SEEK_HOLE), so a 1 GiB volume
    holding a few MiB costs a few MiB to copy."""
    with open(source, "rb") as src, open(dest, "wb") as dst:
        os.fchmod(dst.fileno(), 0o600)
        try:
            fcntl.ioctl(dst.fileno(), FICLONE, src.fileno())
            return
        except OSError:  # ext4 and others: EOPNOTSUPP, EXDEV, EINVAL
            pass
        size = os.fstat(src.fileno()).st_size
        for start, end in data_ranges(src.fileno(), size):
            pos = start
            while pos < end:
                sent = os.copy_file_range(src.fileno(), dst.fileno(), min(end - pos, 64 * MIB),
                                          pos, pos)
                if sent == 0:
                    break
                pos += sent
        dst.truncate(size)
