"""The cache's own files, on the real file system (no server)."""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

from pandastack.host.objects import ObjectCache


def test_what_a_dead_download_left_is_swept_but_not_a_running_one(tmp_path: Path) -> None:
    root = tmp_path / "objects-cache"
    (root / "tmp").mkdir(parents=True)
    dead, alive = hashlib.sha256(b"dead").hexdigest(), hashlib.sha256(b"alive").hexdigest()
    (root / "tmp" / f"{dead}.1234.part").write_bytes(b"half")
    (root / "tmp" / f"{dead}.lock").touch()
    (root / "tmp" / f"{alive}.5678.part").write_bytes(b"half")
    fd = os.open(root / "tmp" / f"{alive}.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another process downloading now
    try:
        cache = ObjectCache(root)
        assert [p.name for p in cache.temp_files()] == [f"{alive}.5678.part", f"{alive}.lock"]
    finally:
        os.close(fd)
    cache.sweep()
    assert cache.temp_files() == []


def test_a_checked_file_is_known_as_checked_until_it_changes(tmp_path: Path) -> None:
    cache = ObjectCache(tmp_path / "c")
    key = hashlib.sha256(b"data").hexdigest()
    temp = cache.new_temp(key)
    temp.write_bytes(b"data")
    path = cache.install(key, temp)
    assert cache.is_checked(key)
    assert ObjectCache(tmp_path / "c").is_checked(key)  # recorded on the file (xattr)
    path.chmod(0o644)
    path.write_bytes(b"dat4")
    assert not cache.is_checked(key)
    assert not cache.check(key)  # hashed: wrong, so removed
    assert not path.exists()
    with cache.lock(key):
        assert (cache.tmp / f"{key}.lock").exists()
    assert cache.temp_files() == []
