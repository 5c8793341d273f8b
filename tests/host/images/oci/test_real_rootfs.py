"""The image builder's own Debian root (mmdebstrap's base.tar, cached under the images cache),
pushed to the loopback registry as an image and pulled back: the tree we unpack is the one
`tar -xp` makes (types, modes, owners, link targets, hard links, contents). (test_pull holds
the layer cache to reading nothing but the manifest on a second pull.)"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from pandastack.host.images.build import base_spec
from pandastack.host.images.oci.cache import LayerCache
from pandastack.rules import DEFAULT_HOME
from tests.host.images.oci.conftest import needs_registry
from tests.host.images.oci.helpers import pull, settings
from tests.host.images.oci.layers import LAYER_TAR, Layout, skopeo_push
from tests.host.images.oci.registry import Registry

BASE_TAR = DEFAULT_HOME / "cache" / "rootfs-base" / base_spec().key() / "base.tar"

pytestmark = [needs_registry, pytest.mark.skipif(
    not BASE_TAR.exists() or os.geteuid() != 0,
    reason="needs root and the image builder's cached base.tar (make run builds it)")]


def tree(root: Path) -> dict[str, tuple[object, ...]]:
    """Every entry's type, mode, owner and content (hash or link target); hard links as the
    sorted names sharing an inode."""
    entries: dict[str, tuple[object, ...]] = {}
    inodes: dict[int, list[str]] = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory) / name
            rel = str(path.relative_to(root))
            info = path.lstat()
            if stat.S_ISREG(info.st_mode):
                content: object = hashlib.sha256(path.read_bytes()).hexdigest()
                inodes.setdefault(info.st_ino, []).append(rel)
            elif stat.S_ISLNK(info.st_mode):
                content = os.readlink(path)
            else:
                content = None
            entries[rel] = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode), info.st_uid,
                            info.st_gid, content)
    for names in inodes.values():
        if len(names) > 1:
            for name in names:
                entries[name] += (tuple(sorted(names)),)
    return entries


def test_a_debian_root_round_trips_through_the_registry(
        registry: Registry, tmp_path: Path, skopeo_policy: Path) -> None:
    layout = Layout(tmp_path / "layout")
    layer = layout.blob_file(BASE_TAR, LAYER_TAR)
    manifest = layout.manifest([layer], [str(layer["digest"])], {"Cmd": ["/bin/bash"]})
    skopeo_push(layout.tag(manifest, "bookworm"), f"{registry.host}/tests/debian:bookworm",
                skopeo_policy)
    cache = LayerCache(tmp_path / "cache", 4 << 30)
    conf = settings(registry.host)
    started = time.monotonic()
    first, root = pull(f"{registry.host}/tests/debian:bookworm", tmp_path, conf, cache)
    print(f"{BASE_TAR.stat().st_size >> 20} MiB image: pulled and unpacked in "
          f"{time.monotonic() - started:.1f} s")
    assert first.fetched == (layer["digest"],)
    expected = tmp_path / "tar"
    expected.mkdir()
    subprocess.run(["tar", "-xpf", str(BASE_TAR), "-C", str(expected), "--numeric-owner",
                    "--xattrs", "--xattrs-include=*"], check=True)
    ours, theirs = tree(root), tree(expected)
    devices = sorted(name for name, entry in theirs.items()
                     if entry[0] in (stat.S_IFCHR, stat.S_IFBLK))
    assert "dev/null" in devices  # mmdebstrap makes them; we do not (the guest's devtmpfs does)
    assert sorted(first.report.skipped) == devices
    assert len(ours) > 5000
    assert ours.keys() == theirs.keys() - set(devices)
    differing = [name for name in ours if ours[name] != theirs[name]]
    assert differing == [], [(name, ours[name], theirs[name]) for name in differing[:5]]
