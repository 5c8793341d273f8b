"""An image's root made bootable: our init, agent and busybox written inside it, through the
image's own links but never out of the root, and nothing of the image run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pandastack.host.images.build import BUSYBOX, ROOTFS_INIT_ASSET, read_asset
from pandastack.host.images.oci.guest_root import TOOLS_DIR, image_init, make_bootable

pytestmark = pytest.mark.skipif(not BUSYBOX.exists(), reason="needs busybox-static")
AGENT = b"\x7fELF static agent"


def test_the_image_init_runs_on_busybox_and_starts_the_static_agent() -> None:
    init = image_init(read_asset(ROOTFS_INIT_ASSET))
    assert init.startswith(f"#!/{TOOLS_DIR}/sh\n".encode())
    assert f":/usr/bin:/sbin:/bin:/{TOOLS_DIR}\n".encode() in init  # the image's tools first
    assert b"exec /opt/pandastack/pandastack-agent --guest" in init
    assert b"python3" not in init


def test_our_files_land_inside_a_root_whose_links_point_out(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "usr/sbin").mkdir(parents=True)
    (root / "sbin").symlink_to("usr/sbin")  # usrmerge: followed, inside
    (root / "opt").symlink_to(outside)  # absolute, out of the root: taken from the root
    (root / "etc").symlink_to("../../outside")  # relative, climbing out: stops at the root
    init = image_init(read_asset(ROOTFS_INIT_ASSET))
    make_bootable(root, agent_binary=AGENT, init_script=init, busybox=BUSYBOX)
    assert os.listdir(outside) == []
    assert (root / "usr/sbin/pandastack-init").read_bytes() == init
    inside_opt = root / str(outside).lstrip("/")
    assert (inside_opt / "pandastack/pandastack-agent").read_bytes() == AGENT
    assert os.readlink(inside_opt / "pandastack/bin/mount") == "busybox"
    assert (root / "outside/hosts").read_text().startswith("127.0.0.1\tlocalhost")
    assert os.readlink(root / "bin/sh") == f"/{TOOLS_DIR}/busybox"  # it had none
    assert (root / "outside/passwd").read_text().startswith("root:x:0:0:")
    assert (root / "tmp").stat().st_mode & 0o7777 == 0o1777


def test_an_images_own_shell_and_accounts_are_kept(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "bin/sh").symlink_to("dash")
    (root / "etc/passwd").write_text("root:x:0:0::/root:/bin/bash\napp:x:1000:1000::/app:/x\n")
    (root / "etc/hosts").symlink_to("/etc/hosts")  # the host's, if it were followed
    host_hosts = Path("/etc/hosts").read_bytes()
    make_bootable(root, agent_binary=AGENT, init_script=b"#!/x\n", busybox=BUSYBOX)
    assert os.readlink(root / "bin/sh") == "dash"
    assert "app:x:1000" in (root / "etc/passwd").read_text()
    assert not (root / "etc/hosts").is_symlink()
    assert Path("/etc/hosts").read_bytes() == host_hosts


def test_an_absolute_sbin_link_is_made_relative_for_the_initramfs(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr/sbin").mkdir(parents=True)
    (root / "sbin").symlink_to("/usr/sbin")
    make_bootable(root, agent_binary=AGENT, init_script=b"#!/x\n", busybox=BUSYBOX)
    assert os.readlink(root / "sbin") == "usr/sbin"
    assert (root / "usr/sbin/pandastack-init").read_bytes() == b"#!/x\n"
