"""The layer cache: blobs by digest, served only for a repository they were verified from,
evicted least recently used first down to the bound."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import BinaryIO

import pytest

from pandastack.host.images.oci.cache import LayerCache


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def add(cache: LayerCache, data: bytes, source: str = "r.example/a") -> str:
    with cache.add(digest(data), source, lambda out: out.write(data)) as blob:
        assert blob.read() == data
    return digest(data)


def present(cache: LayerCache, name: str, source: str = "r.example/a") -> bool:
    blob = cache.open(name, source)
    if blob is None:
        return False
    blob.close()
    return True


def age(cache: LayerCache, name: str, seconds_ago: int) -> None:
    path = cache.root / "blobs" / "sha256" / name.split(":")[1]
    when = path.stat().st_mtime - seconds_ago
    os.utime(path, (when, when))


def test_a_blob_is_served_only_for_a_repository_it_was_verified_from(tmp_path: Path) -> None:
    cache = LayerCache(tmp_path, 1 << 20)
    name = add(cache, b"layer")
    with cache.open(name, "r.example/a") as blob:  # type: ignore[union-attr]
        assert blob.read() == b"layer"
    assert not present(cache, name, "r.example/b")
    add(cache, b"layer", "r.example/b")
    assert cache.sources(name) == ["r.example/a", "r.example/b"]
    assert present(cache, name, "r.example/b")


def test_a_failed_write_leaves_nothing(tmp_path: Path) -> None:
    cache = LayerCache(tmp_path, 1 << 20)

    def broken(out: object) -> None:
        raise RuntimeError("digest mismatch")

    with pytest.raises(RuntimeError):
        cache.add(digest(b"x"), "r/a", broken)
    assert list((tmp_path / "blobs" / "sha256").iterdir()) == []


def test_eviction_drops_the_least_recently_used_down_to_the_bound(tmp_path: Path) -> None:
    cache = LayerCache(tmp_path, 2500)
    old, used, new = (add(cache, bytes([n]) * 1000) for n in range(3))
    age(cache, old, 300)
    age(cache, used, 200)
    age(cache, new, 100)
    assert present(cache, used)  # used now: the newest
    assert cache.evict() == 1000
    assert not present(cache, old)
    assert cache.sources(old) == []
    assert cache.size() == 2000
    # A blob a pull is using stays even when it is the oldest.
    cache = LayerCache(tmp_path, 500)
    age(cache, new, 1000)
    assert cache.evict(keep=[new]) == 1000
    assert present(cache, new)
    assert not present(cache, used)


def test_eviction_sweeps_killed_downloads_but_not_running_ones(tmp_path: Path) -> None:
    cache = LayerCache(tmp_path, 1 << 20)
    add(cache, b"kept")
    blobs = tmp_path / "blobs" / "sha256"
    (blobs / ".tmp-killed").write_bytes(b"half a layer")
    seen: list[list[str]] = []

    def download(out: BinaryIO) -> None:  # another pull's, still running
        out.write(b"running")
        cache.evict()
        seen.append(sorted(p.name for p in blobs.iterdir()))

    add_blob = cache.add(digest(b"running"), "r.example/a", download)
    add_blob.close()
    leftovers = [name for name in seen[0] if name.startswith(".tmp-")]
    assert len(leftovers) == 1 and leftovers != [".tmp-killed"]  # its own tmp stayed
    assert present(cache, digest(b"running"))


def test_digests_are_checked_before_they_become_paths(tmp_path: Path) -> None:
    cache = LayerCache(tmp_path, 1 << 20)
    for bad in ("sha256:../../etc/passwd", "md5:" + "a" * 32, "sha256:" + "A" * 64):
        with pytest.raises(ValueError):
            cache.open(bad, "r/a")


def test_a_blob_open_for_a_pull_is_not_evicted(tmp_path: Path) -> None:
    cache = LayerCache(tmp_path, 1)
    in_use, unused = add(cache, b"a" * 1000), add(cache, b"b" * 1000)
    age(cache, in_use, 300)  # the least recently used: the first to go, were it not open
    blob = cache.open(in_use, "r.example/a")
    assert blob is not None
    with blob:
        # Another pull's eviction (its own cache object, as another process has).
        assert LayerCache(tmp_path, 1).evict() == 1000
        assert cache.sources(in_use) == ["r.example/a"]
        assert blob.read() == b"a" * 1000
    assert cache.sources(unused) == []
    assert cache.evict() == 1000  # closed: it goes now
    assert cache.size() == 0
