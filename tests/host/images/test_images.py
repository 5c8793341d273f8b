"""Guest image pipeline: cache keys (pure), initramfs format, module order, and the real image.

Tests marked `vm` use the real data dir (PANDASTACK_HOME, default /var/lib/pandastack): they build
the image if it is missing (about a minute, needs root and the Debian registry) and boot it once
under QEMU/TCG.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pandastack
from pandastack.host.images import build as images
from pandastack.host.images.build import GuestImage, ImageInputs, image_key
from pandastack.host.images.common import hash_json, sha256_bytes
from pandastack.host.images.initramfs import (
    MODULE_DIR,
    MODULE_LIST,
    CpioWriter,
    initramfs_module_order,
    read_cpio,
)
from pandastack.host.images.kernel import has_pvh_note, order_modules, read_modinfo
from pandastack.host.images.rootfs import (
    BaseSpec,
    _parse_deb822,
    _parse_one_line,
    _remove,
    agent_files,
    python_agent_files,
)
from pandastack.host.vmm.qemu.disk import Qcow2Layers
from pandastack.hostport.errors import SetupError

# --- pure: cache keys ---------------------------------------------------------------------


def _inputs() -> ImageInputs:
    return ImageInputs(
        kernel_package="linux-image-6.1.0-57-amd64",
        kernel_version="6.1.192-3",
        modules=("virtio_ring", "virtio", "ext4"),
        initramfs_init=b"#!/bin/sh\necho init\n",
        rootfs_init=b"#!/bin/sh\necho pid1\n",
        busybox_sha256="ab" * 32,
        base_key="cd" * 32,
        agent={"__init__.py": b"", "agent.py": b"print('hi')\n"},
        rootfs_size=2 << 30,
        cmdline="console=ttyS0 root=/dev/vda rw",
    )


CHANGES: dict[str, Any] = {
    "kernel_package": "linux-image-6.1.0-58-amd64",
    "kernel_version": "6.1.193-1",
    "modules": ("virtio_ring", "virtio", "ext4", "virtio_net"),
    "initramfs_init": b"#!/bin/sh\necho init2\n",
    "rootfs_init": b"#!/bin/sh\necho pid1 v2\n",
    "busybox_sha256": "ef" * 32,
    "base_key": "01" * 32,
    "agent": {"__init__.py": b"", "agent.py": b"print('hello')\n"},
    "rootfs_size": 4 << 30,
    "cmdline": "console=ttyS0 root=/dev/vda rw quiet",
    "recipe": images.RECIPE_VERSION + 1,
    "variant": "node",
    "pip_packages": ("numpy",),
    "files": {"opt/pandastack/kernel_server.py": b"print('serve')\n"},
    "agent_binary": b"\x7fELF binary agent",
    "npm_packages": ("bun@1.4.5",),
    "remove": ("usr/local/lib/unused",),
}


def test_key_is_stable_for_equal_inputs() -> None:
    a, b = _inputs(), _inputs()
    assert image_key(a) == image_key(b)
    # Dict order of the agent files does not matter.
    reordered = dataclasses.replace(a, agent=dict(reversed(list(a.agent.items()))))
    assert image_key(reordered) == image_key(a)


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_key_changes_with_every_input(field: str) -> None:
    base = _inputs()
    changed = dataclasses.replace(base, **{field: CHANGES[field]})
    assert image_key(changed) != image_key(base)


def test_key_changes_when_an_agent_file_is_added() -> None:
    base = _inputs()
    more = dataclasses.replace(base, agent={**base.agent, "ops.py": b""})
    assert image_key(more) != image_key(base)


def test_every_input_field_is_covered() -> None:
    assert set(CHANGES) == {f.name for f in dataclasses.fields(ImageInputs)}


def _spec(**kw: Any) -> BaseSpec:
    spec = BaseSpec(
        suite="bookworm",
        variant="minbase",
        packages=("python3", "curl"),
        sources="deb http://example.invalid/debian bookworm main\n",
        apt_options=(),
        dpkg_options=("path-exclude=/usr/share/man/*",),
    )
    return dataclasses.replace(spec, **kw)


def test_base_key() -> None:
    base = _spec()
    assert base.key() == _spec().key()
    assert _spec(packages=("curl", "python3")).key() == base.key()  # order-insensitive
    for change in (
        {"suite": "trixie"},
        {"variant": "apt"},
        {"packages": ("python3", "curl", "git")},
        {"sources": "deb http://example.invalid/debian bookworm main contrib\n"},
        {"apt_options": ('Acquire::Check-Valid-Until "false";',)},
        {"dpkg_options": ()},
    ):
        assert _spec(**change).key() != base.key(), change


def test_base_variant_keys_as_before_variants_existed() -> None:
    """The `base` image key hashes exactly the pre-variant fields (existing caches stay valid)."""
    inputs = _inputs()
    legacy = hash_json({
        "recipe": inputs.recipe,
        "kernel": [inputs.kernel_package, inputs.kernel_version],
        "modules": list(inputs.modules),
        "initramfs_init": sha256_bytes(inputs.initramfs_init),
        "rootfs_init": sha256_bytes(inputs.rootfs_init),
        "busybox": inputs.busybox_sha256,
        "base": inputs.base_key,
        "agent": {k: sha256_bytes(v) for k, v in sorted(inputs.agent.items())},
        "rootfs_size": inputs.rootfs_size,
        "cmdline": inputs.cmdline,
    })[:32]
    assert inputs.variant == images.BASE and image_key(inputs) == legacy


def test_image_variants() -> None:
    base, node = images.IMAGES["base"], images.IMAGES["node"]
    assert base.packages == images.ROOTFS_PACKAGES
    assert set(node.packages) == {*images.ROOTFS_PACKAGES, "nodejs", "npm"}
    assert images.image_spec("node") is node
    with pytest.raises(SetupError):
        images.image_spec("no-such-variant")
    # A package already in the base list is not listed twice.
    assert images.ImageSpec("x", ("curl",)).packages == images.ROOTFS_PACKAGES
    if shutil.which("apt-config") is not None:
        assert images.base_spec().key() == images.base_spec(base).key()
        assert images.base_spec(node).key() != images.base_spec(base).key()


def test_the_full_variant_has_every_language() -> None:
    """`full` (issue 37): Debian's Python, Node, Go and C toolchains with git and curl, and
    Bun from the npm registry at a pinned version (the image is cached by that name); the
    code interpreter's files as in `node`."""
    full = images.image_spec("full")
    assert {"python3", "nodejs", "npm", "golang-go", "git", "curl", "build-essential",
            "ca-certificates"} <= set(full.packages)
    assert len(full.packages) == len(set(full.packages))
    name, _, version = full.npm_packages[0].rpartition("@")
    assert (full.npm_packages, name) == ((images.BUN_NPM_PACKAGE,), "bun")
    assert all(part.isdigit() for part in version.split(".")), version
    assert full.files == images.IMAGES["node"].files
    assert full.remove == (images.BUN_MUSL_BINARY,)
    # Only variants that ask for npm packages key them: the others keep their cache.
    assert not any(spec.npm_packages or spec.remove for spec in images.IMAGES.values()
                   if spec is not full)


def test_removed_paths_must_be_inside_and_there(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr/lib/pkg/musl").mkdir(parents=True)
    (root / "usr/lib/pkg/musl/bun").write_bytes(b"x")
    (root / "usr/lib/pkg/link").symlink_to("/etc")
    said: list[str] = []
    _remove(root, "usr/lib/pkg/musl", said.append)
    _remove(root, "usr/lib/pkg/link", said.append)  # the link itself, not what it names
    assert sorted(p.name for p in (root / "usr/lib/pkg").iterdir()) == []
    assert said == ["rootfs: removing /usr/lib/pkg/musl", "rootfs: removing /usr/lib/pkg/link"]
    for rel in ("usr/lib/pkg/musl", "/etc", "usr/../../etc"):
        with pytest.raises(SetupError):
            _remove(root, rel, said.append)


def test_real_inputs_are_deterministic() -> None:
    """The inputs the pipeline gathers from this host hash the same twice (no time, no pid)."""
    if shutil.which("apt-config") is None:
        pytest.skip("needs apt")
    spec_a, spec_b = images.base_spec(), images.base_spec()
    assert spec_a.key() == spec_b.key()
    assert "://" in spec_a.sources and "bookworm" in spec_a.sources


# --- pure: host apt sources parsing -------------------------------------------------------


def test_parse_sources() -> None:
    deb822 = (
        "Types: deb deb-src\nURIs: http://a.invalid/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main contrib\nSigned-By: /usr/share/keyrings/k.gpg\n\n"
        "Types: deb\nURIs: http://b.invalid/x\nSuites: bookworm\nComponents: main\n"
        "Enabled: no\n"
    )
    got = _parse_deb822(deb822)
    assert [(s.uri, s.suite, s.components) for s in got] == [
        ("http://a.invalid/debian", "bookworm", ("main", "contrib")),
        ("http://a.invalid/debian", "bookworm-updates", ("main", "contrib")),
    ]
    assert dict(got[0].options) == {"signed-by": "/usr/share/keyrings/k.gpg"}
    one = _parse_one_line(
        "# comment\ndeb [arch=amd64 signed-by=/k.gpg] http://c.invalid/d bookworm main\n"
        "deb-src http://c.invalid/d bookworm main\ndeb http://c.invalid/d sid main # x\n"
    )
    assert [(s.uri, s.suite) for s in one] == [
        ("http://c.invalid/d", "bookworm"),
        ("http://c.invalid/d", "sid"),
    ]
    assert dict(one[0].options) == {"arch": "amd64", "signed-by": "/k.gpg"}


# --- pure: module order, cpio, ELF helpers ------------------------------------------------


def test_order_modules_puts_dependencies_first() -> None:
    deps = {
        "ext4": ["jbd2", "mbcache", "crc16"],
        "jbd2": [],
        "mbcache": [],
        "crc16": [],
        "virtio_blk": ["virtio", "virtio_ring"],
        "virtio": ["virtio_ring"],
        "virtio_ring": [],
    }
    order = order_modules(["virtio_blk", "ext4"], deps)
    assert sorted(order) == sorted(deps)
    for mod, needs in deps.items():
        assert all(order.index(d) < order.index(mod) for d in needs)
    assert order_modules(["virtio-ring"], deps) == ["virtio_ring"]  # dash/underscore alias


def test_order_modules_errors() -> None:
    with pytest.raises(SetupError, match="cycle"):
        order_modules(["a"], {"a": ["b"], "b": ["a"]})
    with pytest.raises(SetupError, match="not found"):
        order_modules(["a"], {"a": ["zz"]})


def test_cpio_roundtrip_and_gnu_cpio_reads_it(tmp_path: Path) -> None:
    w = CpioWriter()
    w.dir("dev")
    w.chardev("dev/console", 5, 1)
    w.file("init", b"#!/bin/sh\n", 0o755)
    w.symlink("bin/sh", "busybox")
    w.file("odd", b"x" * 5)
    data = w.getvalue()
    entries = list(read_cpio(data))
    assert [e.name for e in entries] == ["dev", "dev/console", "init", "bin/sh", "odd"]
    assert stat.S_ISCHR(entries[1].mode) and entries[1].rdev == (5, 1)
    assert entries[2].data == b"#!/bin/sh\n" and stat.S_IMODE(entries[2].mode) == 0o755
    assert entries[4].data == b"xxxxx"
    if shutil.which("cpio"):
        out = (
            subprocess.run(["cpio", "-t", "--quiet"], input=data, capture_output=True, check=True)
            .stdout.decode()
            .split()
        )
        assert out == ["dev", "dev/console", "init", "bin/sh", "odd"]


def test_elf_helpers_reject_garbage() -> None:
    assert not has_pvh_note(b"\x7fELF" + b"\0" * 100)
    assert not has_pvh_note(b"not an elf")
    with pytest.raises(SetupError):
        read_modinfo(b"nope" * 20)


def test_assets_are_shipped() -> None:
    init = images.read_asset(images.INITRAMFS_INIT_ASSET).decode()
    pid1 = images.read_asset(images.ROOTFS_INIT_ASSET).decode()
    assert "PANDASTACK_PROBE_OK" in init and "PANDASTACK_INIT_ERROR" in init
    assert "switch_root /newroot /sbin/pandastack-init" in init
    assert pid1.startswith("#!/bin/sh\n")
    assert "pandastack-init: starting agent" in pid1
    assert "python3 -m pandastack_guest --guest" in pid1  # rewritten for the binary agent
    # The code interpreter ships as an asset and is part of its variant's image.
    shipped = dict(images.KERNEL_SERVER_FILES)
    server = "".join(images.read_package_file(path).decode() for path in shipped.values())
    assert "jupyter_client" in server and "/run/pandastack/code.sock" in server
    assert "runpy" in images.read_package_file(shipped[images.KERNEL_SERVER_PATH]).decode()
    # Every module of the package the entry runs is installed beside it.
    package = Path(pandastack.__file__).parent / "guest" / "assets" / "codeserver"
    assert {f"opt/pandastack/codeserver/{p.name}" for p in package.glob("*.py")} == \
        set(shipped) - {images.KERNEL_SERVER_PATH}
    ci = images.IMAGES["code-interpreter"]
    assert set(images.KERNEL_SERVER_FILES) <= set(ci.files)
    assert "ipykernel" in ci.pip_packages and images.IMAGES["base"].files == ()


def test_agent_files_are_the_agent_packages_only(tmp_path: Path) -> None:
    """Guest code in plain directories (the code interpreter's server in guest/assets) is
    not installed as the agent and does not change the agent's share of the image key."""
    real = agent_files(images.agent_package_dir())
    assert {"__init__.py", "agent.py", "ops.py"} <= set(real)
    assert not [name for name in real if name.startswith("assets/")]
    for rel in ("__init__.py", "agent.py", "sub/__init__.py", "sub/mod.py", "assets/server.py",
                "sub/data/helper.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("# x\n")
    assert set(agent_files(tmp_path)) == {"__init__.py", "agent.py", "sub/__init__.py",
                                          "sub/mod.py"}


def test_python_agent_files_start_without_the_host_package(tmp_path: Path) -> None:
    """The Python agent as an image lays it out under /opt/pandastack: its package and the guest
    protocol's room it imports, and no other pandastack module (site packages are off, so the
    installed pandastack cannot stand in)."""
    files = python_agent_files(images.agent_package_dir(),
                               images.agent_package_dir("pandastack.guestproto"))
    assert "pandastack/guestproto/frames.py" in files and "pandastack_guest/agent.py" in files
    assert {n.split("/")[1] for n in files if n.startswith("pandastack/")} == {
        "__init__.py", "guestproto"}
    for rel, data in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    out = subprocess.run(
        [sys.executable, "-S", "-c", "import pandastack_guest.__main__, pandastack_guest.agent"],
        cwd=tmp_path, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr


# --- the real image (data dir) ------------------------------------------------------------


@pytest.fixture(scope="module")
def built() -> GuestImage:
    if os.geteuid() != 0:
        pytest.skip("building the guest image needs root")
    home = Path(os.environ.get("PANDASTACK_HOME", "/var/lib/pandastack"))
    return images.ensure_base_image(home, progress=lambda _m: None)


@pytest.mark.vm
def test_ensure_base_image_returns_cached_read_only_files(built: GuestImage) -> None:
    home = built.rootfs.parents[3]
    t0 = time.monotonic()
    # Any build step reports progress: none is the proof nothing was rebuilt.
    again = images.ensure_base_image(home, progress=lambda m: pytest.fail(f"rebuilt: {m}"))
    print(f"cached ensure_base_image: {time.monotonic() - t0:.2f} s")
    assert again == built
    for path in (built.kernel, built.initrd, built.rootfs):
        assert path.is_file() and path.stat().st_size > 0
    st = built.rootfs.stat()
    assert stat.S_IMODE(st.st_mode) == 0o444
    assert st.st_size == images.ROOTFS_SIZE
    assert st.st_blocks * 512 < st.st_size // 2  # sparse
    assert built.rootfs.parent.name == built.key
    assert built.kernel_version.endswith("-amd64")
    assert "root=/dev/vda" in built.cmdline and "console=ttyS0" in built.cmdline
    assert not list(built.rootfs.parent.parent.glob(".tmp-*"))


@pytest.mark.vm
def test_initramfs_modules_in_dependency_order(built: GuestImage) -> None:
    order = initramfs_module_order(built.initrd)
    kernel_meta = next(
        json.loads(p.read_text())
        for p in (built.rootfs.parents[2] / "kernel").glob("*/kernel.json")
        if json.loads(p.read_text())["kernel_version"] == built.kernel_version
    )
    deps: dict[str, list[str]] = kernel_meta["depends"]
    names = [n.removesuffix(".ko") for n in order]
    assert set(images.KERNEL_MODULES) <= set(names)
    for i, mod in enumerate(names):
        assert set(deps[mod]) <= set(names[:i]), f"{mod} loaded before its dependencies"
    listing = (
        subprocess.run(
            ["cpio", "-t", "--quiet"],
            input=gzip.decompress(built.initrd.read_bytes()),
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split()
    )
    for need in ("init", "bin/busybox", "dev/console", MODULE_LIST):
        assert need in listing
    assert {f"{MODULE_DIR}/{n}" for n in order} <= set(listing)


@pytest.fixture
def overlay(built: GuestImage, tmp_path: Path) -> Iterator[Path]:
    """A disk over the image's rootfs, made as templates make theirs (QEMU's format: the
    boots below are QEMU's)."""
    disks = Qcow2Layers()
    disk = tmp_path / f"overlay{disks.suffix}"
    disks.create_base(disk, built.rootfs)
    yield disk


def _boot_until(
    built: GuestImage, disk: Path, tmp_path: Path, extra: str, marker: str, deadline_s: float = 90.0
) -> tuple[str, float, subprocess.Popen[bytes]]:
    log = tmp_path / "console.log"
    argv = [
        "qemu-system-x86_64",
        "-M",
        "microvm",
        "-accel",
        "tcg,tb-size=64",
        "-cpu",
        "max",
        "-m",
        "512",
        "-smp",
        "1",
        "-nodefaults",
        "-no-user-config",
        "-no-reboot",
        "-display",
        "none",
        "-serial",
        f"file:{log}",
        "-kernel",
        str(built.kernel),
        "-initrd",
        str(built.initrd),
        "-append",
        f"{built.cmdline} {extra}".strip(),
        "-drive",
        f"id=root,file={disk},format=qcow2,if=none",
        "-device",
        "virtio-blk-device,drive=root",
        "-device",
        "virtio-serial-device",
        "-chardev",
        f"socket,id=agent,path={tmp_path / 'a.sock'},server=on,wait=off",
        "-device",
        "virtserialport,chardev=agent,name=org.pandastack.agent",
    ]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    text = ""
    while time.monotonic() - t0 < deadline_s:
        text = log.read_text(errors="replace") if log.exists() else ""
        if marker in text or "PANDASTACK_INIT_ERROR" in text:
            break
        if proc.poll() is not None:
            text = log.read_text(errors="replace") if log.exists() else ""
            break
        time.sleep(0.05)
    return text, time.monotonic() - t0, proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


@pytest.mark.vm
def test_boot_reaches_the_agent(built: GuestImage, overlay: Path, tmp_path: Path) -> None:
    text, _elapsed, proc = _boot_until(
        built, overlay, tmp_path, "", "pandastack-init: starting agent"
    )
    try:
        assert "PANDASTACK_INIT_ERROR" not in text, text
        assert "pandastack-init: starting agent" in text, text
    finally:
        _stop(proc)


@pytest.mark.vm
def test_probe_mode_powers_off(built: GuestImage, overlay: Path, tmp_path: Path) -> None:
    text, _elapsed, proc = _boot_until(
        built, overlay, tmp_path, "pandastack.probe=1", "PANDASTACK_PROBE_OK"
    )
    try:
        assert "PANDASTACK_PROBE_OK" in text, text
        proc.wait(timeout=30)  # poweroff -f ends QEMU
        assert proc.returncode == 0
        assert "pandastack-init" not in log_text(tmp_path)
    finally:
        _stop(proc)


def log_text(tmp_path: Path) -> str:
    return (tmp_path / "console.log").read_text(errors="replace")
