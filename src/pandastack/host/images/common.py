"""Small helpers shared by the guest image build steps (see `build.py`)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from pandastack.hostport.errors import SetupError

_TMP_PREFIX = ".tmp-"
GUEST_UMASK = 0o022


def run(
    cmd: Sequence[str | Path],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    what: str | None = None,
) -> str:
    """Run a command, return its stdout; raise SetupError with the tail of its output on failure.

    With umask 0022 whatever this process's is (the service's is 0077, host/file_modes.py):
    what these commands write (tar, pip, venv, compileall) has the modes the guest needs."""
    argv = [str(c) for c in cmd]
    full_env = None if env is None else {**os.environ, **env}
    try:
        proc = subprocess.run(
            argv, cwd=cwd, env=full_env, capture_output=True, text=True, check=False,
            umask=GUEST_UMASK,
        )
    except FileNotFoundError as exc:
        raise SetupError(f"{what or argv[0]}: command not found: {argv[0]}") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise SetupError(
            f"{what or argv[0]} failed (exit {proc.returncode}): {' '.join(argv)}\n{tail}"
        )
    return proc.stdout


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def hash_json(value: object) -> str:
    """Stable hash of a JSON-serialisable value (keys sorted)."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return sha256_bytes(blob)


@contextlib.contextmanager
def file_lock(
    path: Path, on_wait: Callable[[], None] | None = None, *, wait: bool = True
) -> Iterator[bool]:
    """Exclusive fcntl.flock on `path` (created if missing) for the duration of the block;
    yields whether it is held (always, unless `wait` is False and another process holds it).

    `on_wait` is called once if another process holds the lock (before blocking on it).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    held = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = True
        except BlockingIOError:
            if wait:
                if on_wait is not None:
                    on_wait()
                fcntl.flock(fd, fcntl.LOCK_EX)
                held = True
        yield held
    finally:
        if held:
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a fresh temporary sibling of `final`; rename it to `final` when the block succeeds.

    A failed or interrupted build leaves only a `.tmp-*` directory, which `remove_stale_tmp`
    deletes later (callers hold the cache lock, so no other build can still be using it).
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f"{_TMP_PREFIX}{final.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(mode=0o755)
    try:
        yield tmp
        _fsync_tree(tmp)
        os.rename(tmp, final)
        fsync_path(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def fsync_path(path: Path) -> None:
    """A file's or a directory's data and metadata to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """Flush every regular file and directory under `root` (not the whole system, as sync does)."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            if p.is_file() and not p.is_symlink():
                fsync_path(p)
        fsync_path(Path(dirpath))


def remove_stale_tmp(parent: Path) -> None:
    """Delete leftovers of interrupted builds. Call only while holding the cache lock."""
    if not parent.is_dir():
        return
    for entry in parent.iterdir():
        if entry.name.startswith(_TMP_PREFIX):
            if entry.is_dir() and not entry.is_symlink():
                _unmount_under(entry)
                _make_writable(entry)
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def sweep_when_idle(lock: Path, parents: Iterable[Path]) -> bool:
    """Delete leftovers of interrupted builds under `parents` if no build holds `lock` now;
    whether it did. For callers that find everything cached and take no lock to build: a
    build killed part-way would otherwise leave its `.tmp-*` until the next build."""
    if not lock.exists():
        return False
    with file_lock(lock, wait=False) as held:
        if not held:
            return False  # a build runs: its own .tmp-* are in use
        for parent in parents:
            remove_stale_tmp(parent)
        return True


def _unmount_under(tree: Path) -> None:
    """Detach mounts left under `tree` by a build killed before it unmounted (builds before
    the pip cache's bind mount moved into a namespace of its own); deepest first."""
    prefix = str(tree.resolve()) + "/"
    with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
        points = [line.split()[1].encode().decode("unicode_escape") for line in f]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def _make_writable(tree: Path) -> None:
    for root, dirs, _files in os.walk(tree):
        for d in dirs:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(root, d), 0o755)


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{_TMP_PREFIX}{path.name}-{uuid.uuid4().hex[:8]}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
