"""`pandastack doctor`'s checks of the host's kernel and machine: what VMs, their jail and their
networks need. One function per check; the parsing parts are pure and take the files' text."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .doctor_model import Context, Finding, unconfigured

if TYPE_CHECKING:
    from pandastack.host.vmm.driver import KernelSpec

GiB = 1 << 30
# Below this the host cannot hold a template's memory file and a few sandboxes' disks.
DISK_FAIL_BYTES = 5 * GiB
DISK_WARN_BYTES = 20 * GiB
# The QEMU pandastack is tested with (Debian 12's); TCG keeps a running guest during a save
# only from 9.0 on (vmm/qemu/driver.py TCG_PRECOPY_FIXED).
QEMU_TESTED = (7, 2)
CGROUP_V2_NEEDED = ("cpu", "memory", "io", "pids")
CGROUP_V1_NEEDED = ("cpu", "memory", "pids")
FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
COMMAND_TIMEOUT_S = 10.0


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str] | None:
    """The command's result, or None when it is not installed or hangs."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def check_accelerator(ctx: Context) -> Finding:
    """KVM proven by a probe boot of the guest kernel (setup's probe, cached per host kernel,
    QEMU and guest kernel), or only TCG."""
    name = "accelerator"
    requested = ctx.host.accel if ctx.host is not None else "auto"
    if requested in ("kvm", "tcg"):
        ctx.accel = requested
        return Finding(name, "ok" if requested == "kvm" else "warn",
                       f"{requested} (PANDASTACK_ACCEL={requested}: not probed)",
                       "" if requested == "kvm" else
                       "TCG emulates the CPU (about 10x slower): unset PANDASTACK_ACCEL where "
                       "KVM works")
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        ctx.accel = "tcg"
        return Finding(name, "warn", "only TCG: /dev/kvm is missing or not writable",
                       "enable virtualization (VT-x/AMD-V in the firmware, nested "
                       "virtualization on a cloud VM), load kvm_intel or kvm_amd, and run as "
                       "root or in the kvm group")
    image = _base_kernel(ctx)
    if image is None:
        return Finding(name, "warn", "/dev/kvm is there, but not proven: the probe boots the "
                       "guest kernel, which is not built yet",
                       "run `pandastack setup`, then `pandastack doctor` again")
    from pandastack.host.vmm.qemu.accel import probe_kvm

    if ctx.quick:
        verdict = _cached_accel(ctx)
        if verdict is None:
            return Finding(name, "warn", "/dev/kvm is there; not proven (--quick skips the "
                           "probe boot, and no earlier verdict is cached)",
                           "run `pandastack doctor` without --quick")
        ctx.accel = verdict
        how = "cached probe verdict"
    else:
        assert ctx.host is not None
        ctx.accel = "kvm" if probe_kvm(image, ctx.host.qemu_binary) else "tcg"
        # The runtime trusts its cached verdict: one that this probe contradicts goes, so the
        # next start probes again.
        if _cached_accel(ctx) not in (None, ctx.accel):
            _forget_accel(ctx)
        how = "probe boot"
    if ctx.accel == "kvm":
        return Finding(name, "ok", f"kvm ({how})")
    return Finding(name, "warn", f"only TCG: /dev/kvm is there but the guest kernel did not "
                   f"boot under it ({how})",
                   "this host's KVM runs only special guests (a PVM host?); use a host or VM "
                   "type with nested virtualization for KVM speed")


def _base_kernel(ctx: Context) -> KernelSpec | None:
    from pandastack.host.vmm.driver import KernelSpec

    from .doctor_services import current_image

    image = current_image(ctx, "base")
    return None if image is None else KernelSpec(image.kernel, image.initrd, image.cmdline)


def _accel_cache_files(ctx: Context) -> list[Path]:
    assert ctx.host is not None
    root = ctx.host.cache_dir / "accel"
    return sorted(root.glob("*.json"), key=lambda p: p.stat().st_mtime) if root.is_dir() else []


def _cached_accel(ctx: Context) -> str | None:
    import json

    files = _accel_cache_files(ctx)
    if not files:
        return None
    return str(json.loads(files[-1].read_text())["accel"])


def _forget_accel(ctx: Context) -> None:
    for path in _accel_cache_files(ctx):
        path.unlink(missing_ok=True)


def parse_qemu_release(first_line: str) -> tuple[int, int] | None:
    match = re.search(r"version (\d+)\.(\d+)", first_line)
    return (int(match.group(1)), int(match.group(2))) if match else None


def check_qemu(ctx: Context) -> Finding:
    binary = ctx.host.qemu_binary if ctx.host is not None else "qemu-system-x86_64"
    out = _run([binary, "--version"])
    if out is None or out.returncode != 0:
        return Finding("qemu", "fail", f"{binary} does not run",
                       "apt-get install qemu-system-x86 (or scripts/host-deps.sh)")
    line = out.stdout.splitlines()[0].strip() if out.stdout else ""
    release = parse_qemu_release(line)
    if release is None or release < QEMU_TESTED:
        return Finding("qemu", "warn", f"{line or binary}: older than the tested "
                       f"{QEMU_TESTED[0]}.{QEMU_TESTED[1]}",
                       "install QEMU 7.2 or newer (Debian 12's qemu-system-x86)")
    return Finding("qemu", "ok", line)


def cgroup_verdict(v2_controllers: str | None, v1_writable: dict[str, bool],
                   v2_writable: bool) -> tuple[str, str]:
    """(status, summary) from `cgroup.controllers` of a v2 root (None: not v2) or, on v1,
    which controller hierarchies are writable."""
    if v2_controllers is not None:
        have = set(v2_controllers.split())
        missing = [c for c in CGROUP_V2_NEEDED if c not in have]
        if missing:
            return "warn", f"cgroup v2 lacks {', '.join(missing)}"
        if not v2_writable:
            return "warn", "cgroup v2, not writable by this user"
        return "ok", f"cgroup v2 ({', '.join(CGROUP_V2_NEEDED)})"
    missing = [c for c in CGROUP_V1_NEEDED if not v1_writable.get(c)]
    if missing:
        return "warn", f"cgroup v1 without writable {', '.join(missing)}"
    return "warn", "cgroup v1 (works; v2 is the tested layout)"


def check_cgroups(ctx: Context) -> Finding:
    from pandastack.host.vmm.cgroups import CGROUP_ROOT, is_v2

    controllers = None
    if is_v2(CGROUP_ROOT):
        controllers = (CGROUP_ROOT / "cgroup.controllers").read_text()
    v1 = {c: os.access(CGROUP_ROOT / c, os.W_OK) for c in CGROUP_V1_NEEDED}
    status, summary = cgroup_verdict(controllers, v1, os.access(CGROUP_ROOT, os.W_OK))
    fix = ""
    if status != "ok":
        fix = ("without writable cgroups the VMM jail is off (VMMs run as root, unlimited); "
               "boot with systemd.unified_cgroup_hierarchy=1 and run the agent as root "
               "(its unit has Delegate=yes)")
        if summary.startswith("cgroup v1 (works"):
            fix = "boot with systemd.unified_cgroup_hierarchy=1 for cgroup v2"
    return Finding("cgroups", status, summary, fix)  # type: ignore[arg-type]


def check_nftables(_ctx: Context) -> Finding:
    out = _run(["nft", "list", "tables"])
    if out is None:
        return Finding("nftables", "fail", "nft is not installed",
                       "apt-get install nftables")
    if out.returncode != 0:
        return Finding("nftables", "fail", f"nft does not work: {out.stderr.strip()[:200]}",
                       "run as root (CAP_NET_ADMIN) on a kernel with nf_tables")
    return Finding("nftables", "ok", "nft works")


def check_tun(_ctx: Context) -> Finding:
    try:
        fd = os.open("/dev/net/tun", os.O_RDWR)
    except OSError as exc:
        return Finding("tun", "fail", f"/dev/net/tun: {exc.strerror}",
                       "modprobe tun; run as root")
    os.close(fd)
    return Finding("tun", "ok", "/dev/net/tun opens")


def check_netns(_ctx: Context) -> Finding:
    out = _run(["unshare", "--net", "true"])
    if out is None or out.returncode != 0:
        why = out.stderr.strip()[:200] if out is not None else "unshare is not installed"
        return Finding("netns", "fail", f"no network namespace: {why}",
                       "run as root on a kernel with CONFIG_NET_NS (util-linux for unshare)")
    ip = _run(["ip", "netns", "list"])
    if ip is None or ip.returncode != 0:
        return Finding("netns", "fail", "`ip netns` does not run", "apt-get install iproute2")
    return Finding("netns", "ok", "network namespaces can be made")


def check_userfaultfd(ctx: Context) -> Finding:
    sysctl = Path("/proc/sys/vm/unprivileged_userfaultfd")
    if not sysctl.exists():
        return Finding("userfaultfd", "warn", "the kernel has no userfaultfd",
                       "a kernel with CONFIG_USERFAULTFD; without it snapshots stop the guest "
                       "for the whole save")
    value = sysctl.read_text().strip()
    if value == "1":
        return Finding("userfaultfd", "ok", "available to the jailed VMMs")
    if ctx.host is not None and ctx.host.jail_userfaultfd:
        return Finding("userfaultfd", "ok", "available (the agent sets "
                       "vm.unprivileged_userfaultfd=1 when it starts)")
    return Finding("userfaultfd", "warn", "vm.unprivileged_userfaultfd=0 and "
                   "PANDASTACK_JAIL_USERFAULTFD=off",
                   "sysctl vm.unprivileged_userfaultfd=1, or jailed VMMs' snapshots stop the "
                   "guest for the whole save")


def parse_thp(enabled: str) -> str | None:
    """The selected mode of transparent_hugepage/enabled ("always [madvise] never")."""
    match = re.search(r"\[(\w+)\]", enabled)
    return match.group(1) if match else None


def check_huge_pages(_ctx: Context) -> Finding:
    thp_file = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    thp = parse_thp(thp_file.read_text()) if thp_file.exists() else None
    meminfo = Path("/proc/meminfo").read_text()
    hugetlb = re.search(r"^Hugepagesize:\s+2048 kB", meminfo, re.MULTILINE) is not None
    if thp in ("always", "madvise") and hugetlb:
        return Finding("huge pages", "ok", f"transparent ({thp}) and 2 MiB hugetlb")
    missing = [what for what, have in (("transparent huge pages", thp in ("always", "madvise")),
                                       ("2 MiB hugetlb pages", hugetlb)) if not have]
    return Finding("huge pages", "warn", f"no {' and no '.join(missing)}",
                   "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled; restores from "
                   "snapshots and forks are slower without huge pages")


def reflinks_work(directory: Path) -> bool:
    """Whether the file system of `directory` clones a file's blocks (FICLONE)."""
    with tempfile.TemporaryDirectory(prefix=".doctor-", dir=directory) as tmp:
        src, dst = Path(tmp) / "a", Path(tmp) / "b"
        src.write_bytes(b"x" * 4096)
        with open(src, "rb") as s, open(dst, "wb") as d:
            try:
                fcntl.ioctl(d.fileno(), FICLONE, s.fileno())
            except OSError as exc:
                if exc.errno in (errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY):
                    return False
                raise
    return True


def disk_verdict(free_bytes: int) -> str:
    if free_bytes < DISK_FAIL_BYTES:
        return "fail"
    return "warn" if free_bytes < DISK_WARN_BYTES else "ok"


def _existing(path: Path) -> Path:
    """`path`, or its nearest existing parent (what it will be made on)."""
    return path if path.exists() else next(p for p in path.parents if p.exists())


def check_disk(ctx: Context) -> Finding:
    """Free space where templates (home), sandboxes' disks (state dir) and volumes live, each
    file system once; reflinks where volumes live (a volume copy is a clone there)."""
    if ctx.host is None:
        return unconfigured("disk")
    places = {"home": ctx.host.home, "state dir": ctx.host.sandboxes_dir,
              "volumes": ctx.host.volumes_dir}
    seen: dict[int, str] = {}
    worst, parts = "ok", []
    for what, path in places.items():
        where = _existing(path)
        device = where.stat().st_dev
        if device in seen:
            continue
        seen[device] = what
        free = shutil.disk_usage(where).free
        verdict = disk_verdict(free)
        worst = max(worst, verdict, key=("ok", "warn", "fail").index)
        parts.append(f"{free / GiB:.1f} GiB free at {path} ({what})")
    volumes = _existing(ctx.host.volumes_dir)
    try:
        reflinks = reflinks_work(volumes) if os.access(volumes, os.W_OK) else None
    except OSError:
        reflinks = None
    clone = {True: "reflinks", False: "no reflinks (volume copies are full copies)",
             None: "reflinks not tested (not writable)"}[reflinks]
    summary = f"{'; '.join(parts)}; volumes: {clone}"
    if worst != "ok":
        return Finding("disk", worst, summary,  # type: ignore[arg-type]
                       f"free space (each needs {DISK_FAIL_BYTES // GiB} GiB, "
                       f"{DISK_WARN_BYTES // GiB} GiB or more for templates and sandboxes), or "
                       f"point PANDASTACK_HOME / PANDASTACK_STATE_DIR at a larger disk")
    if reflinks is not True:
        return Finding("disk", "warn", summary, "put PANDASTACK_VOLUMES_DIR on XFS (reflink=1) "
                       "or btrfs: volume copies become instant")
    return Finding("disk", "ok", summary)


class _Timex(ctypes.Structure):
    # struct timex of glibc on 64-bit Linux: the fields up to `status` are what we read,
    # the rest is padding the kernel writes into.
    _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
                ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long),
                ("status", ctypes.c_int), ("_rest", ctypes.c_byte * 160)]


TIME_ERROR = 5  # adjtimex: the clock is not synchronized
STA_UNSYNC = 0x0040


def clock_synced_by_adjtimex() -> bool | None:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        timex = _Timex()
        state = libc.adjtimex(ctypes.byref(timex))
        if state < 0:
            return None
        return state != TIME_ERROR and not timex.status & STA_UNSYNC
    return None


def clock_synced() -> tuple[bool | None, str]:
    """(synchronized, by what): timedatectl, else chronyc, else the kernel's adjtimex."""
    out = _run(["timedatectl", "show", "-p", "NTPSynchronized", "--value"])
    if out is not None and out.returncode == 0 and out.stdout.strip() in ("yes", "no"):
        return out.stdout.strip() == "yes", "timedatectl"
    out = _run(["chronyc", "-n", "tracking"])
    if out is not None and out.returncode == 0:
        match = re.search(r"^Leap status\s*:\s*(.+)$", out.stdout, re.MULTILINE)
        return (match is not None and match.group(1).strip() == "Normal"), "chronyc"
    return clock_synced_by_adjtimex(), "adjtimex"


def check_clock(_ctx: Context) -> Finding:
    synced, how = clock_synced()
    if synced:
        return Finding("clock", "ok", f"synchronized ({how})")
    summary = "not synchronized" if synced is False else "synchronization unknown"
    return Finding("clock", "warn", f"{summary} ({how})",
                   "run an NTP client (systemd-timesyncd or chrony): hosts of a cluster are "
                   "judged lost by heartbeat times, and signed URLs expire by the clock")
