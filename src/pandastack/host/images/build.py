"""Guest image build pipeline: kernel, initramfs and root filesystem, cached by content hash.

    ensure_image(home, spec) -> GuestImage      one image variant (see ImageSpec, IMAGES)
    ensure_base_image(home) -> GuestImage      the `base` variant

Cache layout (every directory named by the hash of its inputs, built in a `.tmp-*` sibling and
renamed into place, so a half-finished build is never reused):

    home/cache/kernel/resolved.json           linux-image-amd64 -> exact package (memo)
    home/cache/kernel/debs/*.deb              downloaded kernel packages
    home/cache/kernel/<kernel-key>/           vmlinuz, vmlinux (PVH ELF), modules/*.ko, kernel.json
    home/cache/rootfs-base/<base-key>/        base.tar (mmdebstrap output), host.list; one per
                                              variant, keyed by its full package list
    home/cache/images/<image-key>/            vmlinux, vmlinuz, initrd.img, rootfs.img, image.json
    home/cache/.lock                          fcntl.flock, held while building

Needs root and the Debian packages from scripts/host-deps.sh.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from pandastack.host.images.common import (
    atomic_dir,
    file_lock,
    hash_json,
    link_or_copy,
    remove_stale_tmp,
    sha256_bytes,
    sha256_file,
    sweep_when_idle,
)
from pandastack.host.images.initramfs import build_initramfs
from pandastack.host.images.kernel import (
    KernelPackage,
    ensure_kernel,
    resolve_kernel_package,
)
from pandastack.host.images.rootfs import (
    DPKG_OPTIONS,
    BaseSpec,
    build_rootfs,
    check_root,
    ensure_base_tar,
    host_apt_options,
    host_apt_sources,
    missing_tools,
    python_agent_files,
)
from pandastack.hostport.errors import SetupError

# Bump when the build recipe changes in a way the hashed inputs do not capture.
RECIPE_VERSION = 10  # 10: inode tables zeroed by mkfs (rootfs.ROOT_MKFS)

SUITE = "bookworm"
VARIANT = "minbase"
ROOTFS_SIZE = 2 << 30  # bytes; sparse
ROOTFS_PACKAGES: tuple[str, ...] = (
    "python3",
    "python3-pip",
    "python3-venv",
    "python-is-python3",
    "coreutils",
    "procps",
    "ca-certificates",
    "iproute2",
    "curl",
    "e2fsprogs",
    "util-linux",
    "mount",  # mount/umount for /sbin/pandastack-init
    # E2B's SDKs run commands as `user` by default, who may `sudo` (docs/e2b.md).
    "sudo",
)
# Load order is computed from each module's dependencies; this list only says what is needed.
KERNEL_MODULES: tuple[str, ...] = (
    "virtio_ring",
    "virtio",
    "virtio_mmio",
    "virtio_blk",
    "virtio_console",
    "failover",
    "net_failover",
    "virtio_net",
    "crc16",
    "mbcache",
    "crc32c_generic",  # jbd2 and ext4 soft-depend on crc32c
    "jbd2",
    "ext4",
)
BUSYBOX = Path("/bin/busybox")  # from busybox-static
ROOT_DEVICE = "/dev/vda"
# Base kernel command line (part of the image key). `panic=-1` reboots on a panic: run QEMU with
# `-no-reboot` so that a panic ends the process. `pci=off`: microvm has no PCI bus.
CMDLINE = f"console=ttyS0 root={ROOT_DEVICE} rw quiet panic=-1 pci=off"
INITRAMFS_INIT_ASSET = "initramfs-init.sh"
ROOTFS_INIT_ASSET = "pandastack-init.sh"
REQUIRED_TOOLS = ("apt-get", "apt-cache", "apt-config", "dpkg-deb", "mmdebstrap", "mkfs.ext4",
                  "tar", "chroot")

Progress = Callable[[str], None]

BASE = "base"
# Guest code beside the agent, in a plain directory (not a package: the agent never imports it).
# The interpreter is an entry script (what the template runs) and the package it runs.
KERNEL_SERVER_PATH = "opt/pandastack/kernel_server.py"
CODESERVER_MODULES = ("__init__.py", "__main__.py", "protocol.py", "python_kernel.py",
                      "shell.py", "javascript.py", "server.py")
KERNEL_SERVER_FILES: tuple[tuple[str, str], ...] = (
    (KERNEL_SERVER_PATH, "guest/assets/kernel_server.py"),
    *((f"opt/pandastack/codeserver/{m}", f"guest/assets/codeserver/{m}")
      for m in CODESERVER_MODULES),
)

FULL_PACKAGES = ("python3", "nodejs", "npm", "golang-go", "git", "curl", "build-essential",
                 "ca-certificates")
BUN_NPM_PACKAGE = "bun@1.4.5"
# npm 9 (bookworm's) installs every optional package of the host's OS and CPU whatever its
# libc, and Bun's install script keeps the glibc binary: the musl one is 97 MB never run.
BUN_MUSL_BINARY = "usr/local/lib/node_modules/bun/node_modules/@oven/bun-linux-x64-musl"


@dataclass(frozen=True)
class ImageSpec:
    """An image variant: the base package list plus `extra_packages` (Debian package names).

    Built-in variants are trusted and assembled on the host (mmdebstrap installs the extra
    packages into the rootfs); each variant has its own mmdebstrap tarball and image, keyed by
    its full package list (and its name, for every variant but `base`).
    """

    name: str
    extra_packages: tuple[str, ...] = ()
    # Installed from the package index into the guest's /opt/venv when the image is built.
    pip_packages: tuple[str, ...] = ()
    # Installed from the npm registry with the guest's npm (`npm install --global`, under
    # /usr/local) when the image is built: pinned, since the image is cached by this name.
    npm_packages: tuple[str, ...] = ()
    # Paths (relative to the rootfs) removed after the installs: what a package brings that
    # this guest never runs.
    remove: tuple[str, ...] = ()
    # Extra files: (path in the rootfs, path of the file under the pandastack package).
    files: tuple[tuple[str, str], ...] = ()

    @property
    def packages(self) -> tuple[str, ...]:
        extra = tuple(p for p in self.extra_packages if p not in ROOTFS_PACKAGES)
        return ROOTFS_PACKAGES + extra


IMAGES: Mapping[str, ImageSpec] = {
    spec.name: spec
    for spec in (
        ImageSpec(BASE),
        # The interpreter gives node sandboxes `run_code(language="javascript")` (and bash).
        ImageSpec("node", ("nodejs", "npm"), files=KERNEL_SERVER_FILES),
        # ipykernel (with jupyter_client and pyzmq) runs the code interpreter's python
        # contexts, node its javascript ones (E2B's code-interpreter-v1 runs both);
        # kernel_server.py and codeserver/ are the interpreter (see templates/builtin.py).
        ImageSpec("code-interpreter", ("nodejs",),
                  pip_packages=("numpy", "pandas", "pyarrow", "matplotlib", "ipykernel"),
                  files=KERNEL_SERVER_FILES),
        # Every language at once (issue 37): Debian's Python, Node, Go and C toolchains, and
        # Bun from its npm package (Debian has none); the interpreter as in `node`.
        ImageSpec("full", FULL_PACKAGES, npm_packages=(BUN_NPM_PACKAGE,),
                  remove=(BUN_MUSL_BINARY,), files=KERNEL_SERVER_FILES),
    )
}


def image_spec(name: str) -> ImageSpec:
    try:
        return IMAGES[name]
    except KeyError:
        raise SetupError(f"unknown guest image variant {name!r}") from None


@dataclass(frozen=True)
class GuestImage:
    key: str  # content hash of all inputs
    kernel: Path  # for -kernel: uncompressed PVH ELF `vmlinux` (bzImage `vmlinuz` as fallback)
    initrd: Path  # initramfs (gzip-compressed newc cpio)
    rootfs: Path  # raw ext4 image, sparse, read-only (0444): template disks layer over it
    kernel_version: str  # uname -r inside the guest
    cmdline: str  # base kernel command line (CMDLINE + host_cmdline_extras())
    variant: str = BASE  # ImageSpec.name


@dataclass(frozen=True)
class ImageInputs:
    """Everything the image is built from; `image_key` hashes exactly this."""

    kernel_package: str
    kernel_version: str  # Debian package version
    modules: tuple[str, ...]
    initramfs_init: bytes
    rootfs_init: bytes
    busybox_sha256: str
    base_key: str  # suite, variant, packages, apt sources and options
    agent: Mapping[str, bytes] = field(hash=False)
    rootfs_size: int
    cmdline: str
    recipe: int = RECIPE_VERSION
    variant: str = BASE
    pip_packages: tuple[str, ...] = ()
    files: Mapping[str, bytes] = field(default_factory=dict, hash=False)  # rootfs path -> bytes
    npm_packages: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()
    agent_binary: bytes | None = field(default=None, hash=False)  # ADR 0038; None: Python


def image_key(inputs: ImageInputs) -> str:
    # `base` keys exactly as before variants existed, so existing caches stay valid.
    named: dict[str, object] = {} if inputs.variant == BASE else {"variant": inputs.variant}
    if inputs.pip_packages:
        named["pip"] = list(inputs.pip_packages)
    if inputs.npm_packages:
        named["npm"] = list(inputs.npm_packages)
    if inputs.remove:
        named["remove"] = list(inputs.remove)
    if inputs.files:
        named["files"] = {k: sha256_bytes(v) for k, v in sorted(inputs.files.items())}
    if inputs.agent_binary is not None:
        named["agent_binary"] = sha256_bytes(inputs.agent_binary)
    return hash_json(
        {
            **named,
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
        }
    )[:32]


def read_asset(name: str) -> bytes:
    return resources.files("pandastack.host").joinpath("assets", name).read_bytes()


def read_package_file(path: str) -> bytes:
    """A file shipped in the pandastack package, by its path under it (`ImageSpec.files`)."""
    return resources.files("pandastack").joinpath(path).read_bytes()


GUEST_AGENT_ENV = "PANDASTACK_GUEST_AGENT"
"""`binary` (the default) or `python`: which guest agent images get (ADR 0038, ADR 0039)."""
GUEST_AGENT_BUILD = Path(__file__).resolve().parents[4] / "scripts" / "build-guest-agent.sh"


def guest_agent_choice() -> str:
    """`binary` or `python` (the conformance reference, ADR 0039), from `PANDASTACK_GUEST_AGENT`."""
    choice = os.environ.get(GUEST_AGENT_ENV, "binary") or "binary"
    if choice not in ("binary", "python"):
        raise SetupError(f"{GUEST_AGENT_ENV} must be 'binary' or 'python', not {choice!r}")
    return choice


def guest_agent_binary() -> bytes | None:
    """The binary agent's bytes, or None when `PANDASTACK_GUEST_AGENT=python` asks for the
    reference Python agent. Built by scripts/build-guest-agent.sh (cached by content there), of
    the source checkout or the copy an installed wheel carries."""
    if guest_agent_choice() == "python":
        return None
    script = GUEST_AGENT_BUILD
    if not script.is_file():
        # An installed server: its wheel carries the script and the sources as data files,
        # in the checkout's layout under <prefix>/share/pandastack/ (pyproject.toml).
        import importlib.metadata

        try:
            record = importlib.metadata.files("pandastack") or []
        except importlib.metadata.PackageNotFoundError:
            record = []
        want = ("share", "pandastack", "scripts", GUEST_AGENT_BUILD.name)
        script = next((Path(str(f.locate())) for f in record if f.parts[-4:] == want), script)
    if not script.is_file():
        raise SetupError(f"the guest agent binary is built from its sources ({script} is "
                         f"missing: neither a source checkout nor an installed wheel's copy); "
                         f"{GUEST_AGENT_ENV}=python uses the reference Python agent instead")
    # Through bash: an installed copy may have lost its executable bit.
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SetupError(f"building the guest agent failed: {out.stderr.strip()[-2000:]}")
    return Path(out.stdout.strip().splitlines()[-1]).read_bytes()


def agent_package_dir(name: str = "pandastack.guest") -> Path:
    """Directory of the `pandastack.guest` package (its *.py files become the guest agent),
    or of another package the Python agent takes into the guest (`pandastack.guestproto`)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SetupError(f"package {name} (of the guest agent) is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def base_spec(image: ImageSpec = IMAGES[BASE]) -> BaseSpec:
    """The mmdebstrap spec of an image variant (`base` by default)."""
    return BaseSpec(
        suite=SUITE,
        variant=VARIANT,
        packages=image.packages,
        sources=host_apt_sources(SUITE),
        apt_options=host_apt_options(),
        dpkg_options=DPKG_OPTIONS,
    )


def _gather(home: Path, image: ImageSpec, progress: Progress, *,
            refresh: bool = False) -> tuple[ImageInputs, KernelPackage, BaseSpec]:
    pkg = resolve_kernel_package(home / "cache" / "kernel", progress, refresh=refresh)
    spec = base_spec(image)
    if not BUSYBOX.is_file():
        raise SetupError(f"{BUSYBOX} not found: install busybox-static")
    binary = guest_agent_binary()
    inputs = ImageInputs(
        kernel_package=pkg.name,
        kernel_version=pkg.version,
        modules=KERNEL_MODULES,
        initramfs_init=read_asset(INITRAMFS_INIT_ASSET),
        rootfs_init=read_asset(ROOTFS_INIT_ASSET),
        busybox_sha256=sha256_file(BUSYBOX),
        base_key=spec.key(),
        # A binary-agent image carries no Python agent: one agent in the guest, not two.
        agent={} if binary is not None else python_agent_files(
            agent_package_dir(), agent_package_dir("pandastack.guestproto")),
        rootfs_size=ROOTFS_SIZE,
        cmdline=CMDLINE,
        variant=image.name,
        pip_packages=image.pip_packages,
        files={dest: read_package_file(path) for dest, path in image.files},
        npm_packages=image.npm_packages,
        remove=image.remove,
        agent_binary=binary,
    )
    return inputs, pkg, spec


def host_tsc_khz() -> int | None:
    """The host TSC frequency in kHz when /proc/cpuinfo states it reliably, else None.

    Under TCG the guest TSC runs at the host TSC rate, and the guest kernel's PIT-based TSC
    calibration is timing-sensitive: on a busy host it fails and the boot hangs (measured: 6 of
    8 boots under load). `tsc_early_khz=` skips that calibration.
    """
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    flags = re.search(r"^flags\s*:(.*)$", text, re.MULTILINE)
    mhz = re.search(r"^cpu MHz\s*:\s*([0-9.]+)", text, re.MULTILINE)
    if not flags or not mhz:
        return None
    flagset = set(flags.group(1).split())
    # "cpu MHz" is the TSC rate when the frequency is known/fixed (e.g. on a virtual host);
    # on bare metal with frequency scaling it is the current core clock, so leave it alone.
    if "constant_tsc" not in flagset or not flagset & {"tsc_known_freq", "hypervisor"}:
        return None
    khz = round(float(mhz.group(1)) * 1000)
    return khz if khz > 0 else None


def host_cmdline_extras() -> str:
    """Host-specific kernel parameters appended to CMDLINE (not part of the image key)."""
    khz = host_tsc_khz()
    return f" tsc_early_khz={khz}" if khz else ""


def _load(final: Path, key: str, variant: str) -> GuestImage:
    meta = json.loads((final / "image.json").read_text())
    return GuestImage(
        key=key,
        kernel=final / meta["kernel"],
        initrd=final / "initrd.img",
        rootfs=final / "rootfs.img",
        kernel_version=meta["kernel_version"],
        cmdline=meta["cmdline"] + host_cmdline_extras(),
        variant=variant,
    )


def _build_dirs(home: Path) -> tuple[Path, ...]:
    """Where an image build makes its `.tmp-*` directories."""
    return tuple(home / "cache" / sub for sub in ("kernel", "kernel/debs", "rootfs-base", "images"))


def ensure_base_image(home: Path, *, progress: Progress = print) -> GuestImage:
    """The `base` image variant (see `ensure_image`)."""
    return ensure_image(home, IMAGES[BASE], progress=progress)


def ensure_image(home: Path, image: ImageSpec, *, progress: Progress = print) -> GuestImage:
    """Build (or find in `home/cache`) the guest kernel, initramfs and rootfs of a variant.

    A cached image is returned without taking the lock or starting any build step. Otherwise the
    missing steps run under an exclusive lock on `home/cache/.lock`; concurrent callers wait and
    then find the finished image.
    """
    home = Path(home)
    variant = image.name
    inputs, pkg, spec = _gather(home, image, progress)
    key = image_key(inputs)
    images = home / "cache" / "images"
    final = images / key
    if (final / "image.json").exists():
        sweep_when_idle(home / "cache" / ".lock", _build_dirs(home))
        return _load(final, key, variant)

    check_root()
    missing = missing_tools(REQUIRED_TOOLS)
    if missing:
        raise SetupError(f"missing host tools: {', '.join(missing)} (run scripts/host-deps.sh)")
    with file_lock(
        home / "cache" / ".lock",
        on_wait=lambda: progress("waiting for another process that is building an image"),
    ):
        if (final / "image.json").exists():
            return _load(final, key, variant)
        for parent in _build_dirs(home):
            remove_stale_tmp(parent)
        progress(f"building guest image {variant} {key[:12]}")
        t0 = time.monotonic()
        kernel_cache = home / "cache" / "kernel"
        try:
            kernel = ensure_kernel(kernel_cache, pkg, inputs.modules, progress)
        except SetupError:
            # The package index may be stale (the version is gone from the registry): refresh.
            inputs, pkg, spec = _gather(home, image, progress, refresh=True)
            key = image_key(inputs)
            final = images / key
            if (final / "image.json").exists():
                return _load(final, key, variant)
            kernel = ensure_kernel(kernel_cache, pkg, inputs.modules, progress)
        base_tar = ensure_base_tar(home / "cache" / "rootfs-base", spec, progress)
        with atomic_dir(final) as out:
            progress("initramfs: busybox + modules + /init")
            build_initramfs(
                out / "initrd.img",
                busybox=BUSYBOX,
                init_script=inputs.initramfs_init,
                modules=kernel.modules,
            )
            link_or_copy(kernel.vmlinuz, out / "vmlinuz")
            if kernel.boot_kernel != kernel.vmlinuz:
                link_or_copy(kernel.boot_kernel, out / kernel.boot_kernel.name)
            build_rootfs(
                out / "rootfs.img",
                base_tar=base_tar,
                agent=inputs.agent,
                init_script=inputs.rootfs_init,
                size=inputs.rootfs_size,
                scratch_parent=images,
                progress=progress,
                pip_packages=inputs.pip_packages,
                pip_cache=home / "cache" / "pip",
                files=inputs.files,
                agent_binary=inputs.agent_binary,
                npm_packages=inputs.npm_packages,
                npm_cache=home / "cache" / "npm",
                remove=inputs.remove,
            )
            meta = {
                "key": key,
                "variant": variant,
                "packages": list(spec.packages),
                "kernel_package": pkg.name,
                "kernel_package_version": pkg.version,
                "kernel": kernel.boot_kernel.name,
                "kernel_version": kernel.kernel_version,
                "modules": [m.name for m in kernel.modules],
                "base_key": spec.key(),
                "agent_files": sorted(inputs.agent),
                "files": sorted(inputs.files),
                "npm_packages": list(inputs.npm_packages),
                "rootfs_size": inputs.rootfs_size,
                "cmdline": inputs.cmdline,
                "built_at": time.time(),
            }
            for name in ("vmlinuz", kernel.boot_kernel.name, "initrd.img", "rootfs.img"):
                os.chmod(out / name, 0o444)
            (out / "image.json").write_text(json.dumps(meta, indent=2) + "\n")
        progress(f"guest image {variant} {key[:12]} ready in {time.monotonic() - t0:.1f} s")
    return _load(final, key, variant)
