"""Layers applied in order into a root filesystem directory, as a container runtime would, but
on a host that must not be harmed by what a layer holds.

Every write goes through directory file descriptors opened with O_NOFOLLOW from the root's
own: a path through a symlink is resolved inside the root (an absolute target from the root,
`..` stopping at it), never by the kernel. Entries with `..` are refused, absolute names are
taken from the root, device nodes are not made (listed in the report), hard links name
files inside the root. Whiteouts (`.wh.name`) remove what lower layers made; an opaque
directory (`.wh..wh..opq`) drops every lower child. Layers are plain, gzip or zstd tar
streams (told by their first bytes). The decompressed bytes, the bytes written and the
entries of a whole image are bounded (a gzip or zstd bomb stops at the bound).
"""

from __future__ import annotations

import gzip
import os
import stat
import tarfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

import zstandard

from pandastack.host.images.oci.errors import ImageInvalid, ImageTooLarge, UnsafeLayerEntry
from pandastack.host.images.oci.inside import DIR_FLAGS, InsideRoot, remove_entry

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
_CHUNK = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# A zstd frame names the window its decoder must allocate (the format can ask for terabytes). 128
# MiB is zstd's own default limit and what `zstd --long` writes; a larger one is refused
# before anything is allocated, so a layer cannot take the host's memory that way.
MAX_ZSTD_WINDOW = 1 << 27
_ZSTD_HEADER = 18  # the longest frame header
# Extended attributes a layer may set: file capabilities (ping) and the user namespace.
_XATTR_PREFIX = "SCHILY.xattr."
_XATTRS_KEPT = ("security.capability", "user.")


@dataclass
class UnpackBudget:
    """What a whole image may take while unpacking; shared by its layers."""

    image: str
    max_bytes: int
    max_entries: int
    read: int = 0  # decompressed tar bytes
    written: int = 0  # file contents written
    entries: int = 0

    def take_read(self, count: int) -> None:
        self.read += count
        if self.read > self.max_bytes:
            raise ImageTooLarge(self.image, f"unpacks to more than {self.max_bytes} bytes")

    def take_written(self, count: int) -> None:
        self.written += count
        if self.written > self.max_bytes:
            raise ImageTooLarge(self.image, f"unpacks to more than {self.max_bytes} bytes")

    def take_entry(self) -> None:
        self.entries += 1
        if self.entries > self.max_entries:
            raise ImageTooLarge(self.image, f"has more than {self.max_entries} files")


@dataclass
class UnpackReport:
    skipped: list[str] = field(default_factory=list)  # device nodes, not made


class _Readable(Protocol):
    def read(self, size: int = ..., /) -> bytes: ...


class _Counted:
    """The decompressed stream, charged to the budget as tarfile reads it."""

    def __init__(self, inner: _Readable, budget: UnpackBudget) -> None:
        self._inner = inner
        self._budget = budget
        self.image = budget.image

    def read(self, size: int = -1) -> bytes:
        data = self._inner.read(size if size >= 0 else _CHUNK)
        self._budget.take_read(len(data))
        return data


def _decompressed(blob: BinaryIO, image: str, layer: str) -> _Readable:
    head = blob.read(_ZSTD_HEADER)
    blob.seek(0)
    if head.startswith(_GZIP_MAGIC):
        return gzip.GzipFile(fileobj=blob, mode="rb")
    if head.startswith(_ZSTD_MAGIC):
        try:
            window = zstandard.get_frame_parameters(head).window_size
        except zstandard.ZstdError as exc:
            raise ImageInvalid(image, f"layer {layer} is not a valid zstd stream: {exc}"
                               ) from None
        if window > MAX_ZSTD_WINDOW:
            raise ImageTooLarge(image, f"layer {layer} asks for a {window}-byte zstd window "
                                       f"(the bound is {MAX_ZSTD_WINDOW})")
        # Across frames: zstd:chunked layers are many frames and skippable ones. A later
        # frame's window over the bound is the decoder's error (ZstdError, below).
        decoder = zstandard.ZstdDecompressor(max_window_size=MAX_ZSTD_WINDOW)
        return decoder.stream_reader(blob, read_size=_CHUNK, read_across_frames=True)
    return blob


def clean_path(image: str, name: str) -> tuple[str, ...]:
    """A layer entry's name as components under the root: an absolute name is taken from the
    root, `.` dropped; any `..` is refused."""
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        raise UnsafeLayerEntry(image, f"layer entry {name!r} has a '..' component")
    return parts


def _owner(fd: int | None, member: tarfile.TarInfo, *, name: str = "",
           parent_fd: int | None = None) -> None:
    if os.geteuid() != 0:
        return
    if fd is not None:
        os.fchown(fd, member.uid, member.gid)
    else:
        os.chown(name, member.uid, member.gid, dir_fd=parent_fd, follow_symlinks=False)


def _xattrs(fd: int, member: tarfile.TarInfo) -> None:
    for key, value in member.pax_headers.items():
        if key.startswith(_XATTR_PREFIX):
            attr = key[len(_XATTR_PREFIX):]
            if attr.startswith(_XATTRS_KEPT):
                os.setxattr(fd, attr, value.encode("utf-8", "surrogateescape"))


MAX_HEADER_BYTES = 1 << 20  # one pax or GNU long-name header (tarfile reads it whole)
_META_TYPES = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE,
               tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)


class _BoundedTarInfo(tarfile.TarInfo):
    """tarfile reads a pax or long-name header's body into memory whole: a layer claiming a
    2 GiB one (zeros, a few MiB compressed) would take that much of the host's memory before
    any byte bound is reached. Refused above MAX_HEADER_BYTES (real ones are a few KiB)."""

    def _proc_member(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _META_TYPES and self.size > MAX_HEADER_BYTES:
            raise ImageTooLarge(_image_of(tar), f"a layer has a {self.size}-byte tar header "
                                                f"(the bound is {MAX_HEADER_BYTES})")
        return super()._proc_member(tar)  # type: ignore[misc, no-any-return]


def _image_of(tar: tarfile.TarFile) -> str:
    stream = getattr(tar.fileobj, "fileobj", None)
    return stream.image if isinstance(stream, _Counted) else "?"


class _LayerWriter:
    def __init__(self, root: InsideRoot, budget: UnpackBudget, report: UnpackReport,
                 layer: str) -> None:
        self.root = root
        self.budget = budget
        self.report = report
        self.layer = layer
        self.added: set[tuple[str, ...]] = set()  # paths this layer made (and their parents)

    def apply(self, tar: tarfile.TarFile) -> None:
        for member in tar:
            # tarfile keeps every member it read (for its own extract's hard links, which we
            # do not use): a million-entry layer would hold them all in memory.
            tar.members.clear()  # type: ignore[attr-defined]
            self.budget.take_entry()
            parts = clean_path(self.root.image, member.name)
            if not parts:
                continue
            try:
                self._entry(tar, member, parts)
            except OSError as exc:
                raise ImageInvalid(self.root.image, f"layer {self.layer}: {member.name!r}: "
                                                    f"{exc.strerror or exc}") from None

    def _mark(self, path: tuple[str, ...]) -> None:
        for end in range(1, len(path) + 1):
            self.added.add(path[:end])

    def _entry(self, tar: tarfile.TarFile, member: tarfile.TarInfo,
               parts: tuple[str, ...]) -> None:
        leaf = parts[-1]
        parent, parent_fd = self.root.resolve_dir(parts[:-1], member.name, create=True)
        try:
            if leaf == OPAQUE:
                for child in os.listdir(parent_fd):
                    if (*parent, child) not in self.added:
                        remove_entry(parent_fd, child)
                return
            if leaf.startswith(WHITEOUT):
                hidden = leaf[len(WHITEOUT):]
                if hidden and not hidden.startswith(WHITEOUT) and hidden not in (".", "..") \
                        and (*parent, hidden) not in self.added:
                    remove_entry(parent_fd, hidden)
                return
            path = (*parent, leaf)
            if member.ischr() or member.isblk():
                self.report.skipped.append("/".join(path))
                return
            self._mark(path)
            self._make(tar, member, parent_fd, leaf)
        finally:
            os.close(parent_fd)

    def _make(self, tar: tarfile.TarFile, member: tarfile.TarInfo,
              parent_fd: int, leaf: str) -> None:
        mode = member.mode & 0o7777
        if member.isdir():
            try:
                existing = os.lstat(leaf, dir_fd=parent_fd)
            except FileNotFoundError:
                existing = None
            if existing is None or not stat.S_ISDIR(existing.st_mode):
                remove_entry(parent_fd, leaf)
                os.mkdir(leaf, 0o700, dir_fd=parent_fd)
            fd = os.open(leaf, DIR_FLAGS, dir_fd=parent_fd)
            try:
                _owner(fd, member)
                os.fchmod(fd, mode)
                _xattrs(fd, member)
            finally:
                os.close(fd)
            return
        remove_entry(parent_fd, leaf)
        if member.isreg():
            self._write_file(tar, member, parent_fd, leaf, mode)
        elif member.issym():
            os.symlink(member.linkname, leaf, dir_fd=parent_fd)
            _owner(None, member, name=leaf, parent_fd=parent_fd)
        elif member.islnk():
            self._hard_link(member, parent_fd, leaf)
        elif member.isfifo():
            os.mkfifo(leaf, mode, dir_fd=parent_fd)
            _owner(None, member, name=leaf, parent_fd=parent_fd)
        else:
            raise ImageInvalid(self.root.image, f"layer {self.layer}: {member.name!r} is of "
                                                f"tar type {member.type!r}")

    def _write_file(self, tar: tarfile.TarFile, member: tarfile.TarInfo, parent_fd: int,
                    leaf: str, mode: int) -> None:
        self.budget.take_written(member.size)
        source = tar.extractfile(member)
        fd = os.open(leaf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=parent_fd)
        try:
            if source is not None:
                while chunk := source.read(_CHUNK):
                    _write_all(fd, chunk)
            _owner(fd, member)
            os.fchmod(fd, mode)  # after chown, which clears set-id bits
            _xattrs(fd, member)
            mtime = int(member.mtime)
            os.utime(fd, (mtime, mtime))
        finally:
            os.close(fd)

    def _hard_link(self, member: tarfile.TarInfo, parent_fd: int, leaf: str) -> None:
        target = clean_path(self.root.image, member.linkname)
        if not target:
            raise UnsafeLayerEntry(self.root.image, f"{member.name!r} links to the root")
        _, target_fd = self.root.resolve_dir(target[:-1], member.name, create=False)
        try:
            info = os.lstat(target[-1], dir_fd=target_fd)
            if stat.S_ISDIR(info.st_mode):
                raise UnsafeLayerEntry(self.root.image, f"{member.name!r} hard-links a "
                                                        "directory")
            os.link(target[-1], leaf, src_dir_fd=target_fd, dst_dir_fd=parent_fd,
                    follow_symlinks=False)
        finally:
            os.close(target_fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def apply_layers(layers: Iterable[tuple[str, BinaryIO]], root: Path, budget: UnpackBudget
                 ) -> UnpackReport:
    """Apply `(name, seekable blob)` layers in order onto the directory `root`."""
    report = UnpackReport()
    handle = InsideRoot(root, budget.image)
    try:
        for name, blob in layers:
            stream = _Counted(_decompressed(blob, budget.image, name), budget)
            try:
                with tarfile.open(fileobj=stream, mode="r|",  # type: ignore[call-overload]
                                  tarinfo=_BoundedTarInfo) as tar:
                    _LayerWriter(handle, budget, report, name).apply(tar)
            except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile,
                    zstandard.ZstdError) as exc:
                raise ImageInvalid(budget.image, f"layer {name} is not a valid tar stream: "
                                                 f"{exc}") from None
    finally:
        handle.close()
    return report
