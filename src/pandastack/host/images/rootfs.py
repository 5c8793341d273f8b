"""Guest root filesystem: an mmdebstrap base tarball (cached) plus the pandastack layer.

The base uses the host's own apt sources (the entries for the guest's suite) and the host's apt
network settings (proxy, Release date checks), so no mirror is named anywhere here.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pandastack.host.images.common import atomic_dir, hash_json, run
from pandastack.host.images.kernel import apt_config
from pandastack.hostport.errors import SetupError

Progress = Callable[[str], None]

# apt options copied from the host configuration into mmdebstrap (and thus into the guest).
FORWARDED_APT_OPTIONS = (
    "Acquire::http::Proxy",
    "Acquire::https::Proxy",
    "Acquire::Check-Valid-Until",
    "Acquire::Check-Date",
)

# Keep the image small: no manuals, docs (except copyright notices) or translations.
DPKG_OPTIONS = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
)

AGENT_ROOT = "opt/pandastack"
"""The Python agent's files are under it (the init script starts it there): the agent package
`pandastack_guest` and the guest protocol's room it imports, `pandastack/guestproto`."""
AGENT_DIR = f"{AGENT_ROOT}/pandastack_guest"
AGENT_BINARY = "opt/pandastack/pandastack-agent"
"""Where an image built with the binary agent (ADR 0038) has it."""
_PYTHON_AGENT_START = b"exec python3 -m pandastack_guest --guest"
HOSTNAME = "pandastack"
E2B_USER = "user"


@dataclass(frozen=True)
class BaseSpec:
    """Everything that determines the mmdebstrap output."""

    suite: str
    variant: str
    packages: tuple[str, ...]
    sources: str  # one-line-style sources.list text
    apt_options: tuple[str, ...]
    dpkg_options: tuple[str, ...]

    def key(self) -> str:
        return hash_json(
            {
                "suite": self.suite,
                "variant": self.variant,
                "packages": sorted(self.packages),
                "sources": self.sources,
                "apt_options": list(self.apt_options),
                "dpkg_options": list(self.dpkg_options),
            }
        )


# --- host apt sources -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    uri: str
    suite: str
    components: tuple[str, ...]
    options: tuple[tuple[str, str], ...]


# The inode tables are zeroed here, once, not by the guest kernel's ext4lazyinit thread after
# boot: that thread was still at work when a template was saved, so every clone ran it (and
# its exit) again right after its restore (bench/minimal_floor_translation.py's profile).
ROOT_MKFS = ["mkfs.ext4", "-F", "-q", "-m", "0", "-E", "lazy_itable_init=0",
             "-L", "pandastack-root"]


def _parse_one_line(text: str) -> list[_Source]:
    out: list[_Source] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        opts: list[tuple[str, str]] = []
        m = re.match(r"^(\S+)\s+\[([^\]]*)\]\s+(.*)$", line)
        if m:
            kind, optstr, rest = m.group(1), m.group(2), m.group(3)
            for opt in optstr.split():
                k, _, v = opt.partition("=")
                opts.append((k.lower(), v))
        else:
            kind, _, rest = line.partition(" ")
        parts = rest.split()
        if kind != "deb" or len(parts) < 2:
            continue
        out.append(_Source(parts[0], parts[1], tuple(parts[2:]), tuple(opts)))
    return out


_DEB822_OPTIONS = {"signed-by": "signed-by", "architectures": "arch", "trusted": "trusted"}


def _parse_deb822(text: str) -> list[_Source]:
    out: list[_Source] = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = None
        for raw in stanza.splitlines():
            if raw.startswith("#"):
                continue
            if raw[:1] in (" ", "\t") and key is not None:
                fields[key] += "\n" + raw.strip()
                continue
            k, sep, v = raw.partition(":")
            if sep:
                key = k.strip().lower()
                fields[key] = v.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").lower() == "no":
            continue
        opts: list[tuple[str, str]] = []
        for name, opt in _DEB822_OPTIONS.items():
            value = fields.get(name, "")
            if value and "\n" not in value:  # inline keys cannot be expressed in one-line style
                opts.append((opt, ",".join(value.split())))
        for uri in fields.get("uris", "").split():
            for suite in fields.get("suites", "").split():
                out.append(_Source(uri, suite, tuple(fields.get("components", "").split()),
                                   tuple(opts)))
    return out


def host_apt_sources(suite: str) -> str:
    """The host's enabled `deb` entries for `suite` and `suite-*`, as one-line sources.list."""
    conf = apt_config("Dir::Etc::sourcelist/f", "Dir::Etc::sourceparts/d")
    files: list[Path] = []
    main = Path(conf.get("Dir::Etc::sourcelist/f", "/etc/apt/sources.list"))
    if main.is_file():
        files.append(main)
    parts = Path(conf.get("Dir::Etc::sourceparts/d", "/etc/apt/sources.list.d"))
    if parts.is_dir():
        files += sorted(p for p in parts.iterdir() if p.suffix in (".list", ".sources"))
    sources: list[_Source] = []
    for f in files:
        text = f.read_text(errors="replace")
        sources += _parse_deb822(text) if f.suffix == ".sources" else _parse_one_line(text)
    lines: list[str] = []
    for s in sources:
        if s.uri.startswith("cdrom:"):
            continue
        if not (s.suite == suite or s.suite.startswith((f"{suite}-", f"{suite}/"))):
            continue
        opts = " ".join(f"{k}={v}" for k, v in s.options)
        line = f"deb {'[' + opts + '] ' if opts else ''}{s.uri} {s.suite} {' '.join(s.components)}"
        if line not in lines:
            lines.append(line)
    if not lines:
        raise SetupError(
            f"the host's apt sources have no 'deb' entry for suite {suite!r}; the guest rootfs "
            "is built from the host's own Debian sources"
        )
    return "".join(f"{line}\n" for line in lines)


def host_apt_options() -> tuple[str, ...]:
    values = apt_config(*FORWARDED_APT_OPTIONS)
    return tuple(
        f'{k} "{values[k]}";' for k in FORWARDED_APT_OPTIONS if values.get(k, "") != ""
    )


# --- building -------------------------------------------------------------------------------


def ensure_base_tar(cache: Path, spec: BaseSpec, progress: Progress) -> Path:
    """`cache/<key>/base.tar`: the mmdebstrap output for `spec`."""
    final = cache / spec.key()
    tar = final / "base.tar"
    if tar.exists():
        return tar
    progress(f"rootfs: mmdebstrap {spec.variant} {spec.suite} ({len(spec.packages)} packages)")
    with atomic_dir(final) as out:
        sources = out / "host.list"
        sources.write_text(spec.sources)
        cmd: list[str | Path] = [
            "mmdebstrap",
            f"--variant={spec.variant}",
            "--mode=root",
            "--format=tar",
            f"--include={','.join(spec.packages)}",
        ]
        cmd += [f"--aptopt={o}" for o in spec.apt_options]
        cmd += [f"--dpkgopt={o}" for o in spec.dpkg_options]
        cmd += [spec.suite, out / "base.tar", sources]
        env = {"TMPDIR": str(out)}
        run(cmd, env=env, what="mmdebstrap")
        (out / "base.tar").chmod(0o444)
    return tar


def agent_files(agent_dir: Path) -> dict[str, bytes]:
    """Every `*.py` file of the agent package and its sub-packages, by relative path.

    Files in plain directories (guest/assets: code other images install elsewhere, such as
    the code interpreter's server) are not part of the agent."""
    files: dict[str, bytes] = {}
    for path in sorted(agent_dir.rglob("*.py")):
        rel = path.relative_to(agent_dir)
        if "__pycache__" in rel.parts or not _in_package(agent_dir, rel):
            continue
        files[rel.as_posix()] = path.read_bytes()
    return files


def python_agent_files(agent_dir: Path, room_dir: Path) -> dict[str, bytes]:
    """What a Python-agent image holds under AGENT_ROOT, by relative path: the agent package
    as `pandastack_guest` and the guest protocol's room as `pandastack.guestproto`, which the
    agent imports by that absolute name (its `pandastack` package holds nothing else)."""
    files = {f"pandastack_guest/{rel}": data for rel, data in agent_files(agent_dir).items()}
    files["pandastack/__init__.py"] = b""
    files.update({f"pandastack/guestproto/{rel}": data
                  for rel, data in agent_files(room_dir).items()})
    return files


def init_for_binary_agent(init_script: bytes) -> bytes:
    """The init script, starting the binary agent where it starts the Python one. Rewritten
    here rather than in the asset, so images with the Python agent keep their content key."""
    if init_script.count(_PYTHON_AGENT_START) != 1:
        raise SetupError("the rootfs init does not start the Python agent where expected")
    return init_script.replace(_PYTHON_AGENT_START, b"exec /" + AGENT_BINARY.encode() + b" --guest")


def _in_package(root: Path, rel: Path) -> bool:
    """Whether every directory from `root` down to `rel`'s is a Python package."""
    return all((root.joinpath(*rel.parts[:depth]) / "__init__.py").is_file()
               for depth in range(len(rel.parts)))


def build_rootfs(
    image: Path,
    *,
    base_tar: Path,
    agent: Mapping[str, bytes],
    init_script: bytes,
    size: int,
    scratch_parent: Path,
    progress: Progress,
    pip_packages: tuple[str, ...] = (),
    pip_cache: Path | None = None,
    files: Mapping[str, bytes] | None = None,
    agent_binary: bytes | None = None,
    npm_packages: tuple[str, ...] = (),
    npm_cache: Path | None = None,
    remove: tuple[str, ...] = (),
) -> None:
    """Unpack the base, add the pandastack layer and write a sparse ext4 image (no mounting).

    `files` maps paths relative to the rootfs to their contents (mode 0644). With
    `agent_binary` (ADR 0038) the init starts that binary as the agent instead of Python.
    `npm_packages` are installed globally (under /usr/local) with the guest's own npm; the
    paths in `remove` go after the installs (each must be there: a pinned package that
    moved them is a recipe to look at again)."""
    with tempfile.TemporaryDirectory(dir=scratch_parent, prefix=".tmp-rootfs-") as tmp:
        root = Path(tmp) / "root"
        root.mkdir(mode=0o755)
        progress("rootfs: unpacking base")
        run(["tar", "-xpf", base_tar, "-C", root, "--numeric-owner", "--xattrs",
             "--xattrs-include=*"], what="tar")
        progress(f"rootfs: installing agent ({len(agent)} files) and init")
        if agent_binary is not None:
            init_script = init_for_binary_agent(init_script)
            dest = root / AGENT_BINARY
            _guest_dirs(dest.parent)
            dest.write_bytes(agent_binary)
            dest.chmod(0o755)
        _customize(root, agent, init_script)
        for rel, data in sorted((files or {}).items()):
            if Path(rel).is_absolute() or ".." in Path(rel).parts:
                raise SetupError(f"image file {rel!r} is outside the rootfs")
            dest = root / rel
            _guest_dirs(dest.parent)
            dest.write_bytes(data)
            dest.chmod(0o644)
        if pip_packages:
            progress(f"rootfs: pip install {' '.join(pip_packages)}")
            _pip_install(root, pip_packages, pip_cache or scratch_parent / "pip-cache")
        if npm_packages:
            progress(f"rootfs: npm install --global {' '.join(npm_packages)}")
            _npm_install(root, npm_packages, npm_cache or scratch_parent / "npm-cache")
        for rel in remove:
            _remove(root, rel, progress)
        progress(f"rootfs: mkfs.ext4 ({size >> 20} MiB sparse)")
        image.unlink(missing_ok=True)
        with image.open("wb") as f:
            f.truncate(size)
        run([*ROOT_MKFS, "-d", root, image, f"{size // 1024}k"], what="mkfs.ext4")


def _remove(root: Path, rel: str, progress: Progress) -> None:
    path = root / rel
    if Path(rel).is_absolute() or ".." in Path(rel).parts or not os.path.lexists(path):
        raise SetupError(f"image path to remove {rel!r} is not in the rootfs")
    progress(f"rootfs: removing /{rel}")
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


VENV = "opt/venv"
PIP_CACHE_IN_ROOT = "var/cache/pandastack-pip"
NPM_CACHE_IN_ROOT = "var/cache/pandastack-npm"
HOST_CA_IN_ROOT = "var/cache/pandastack-host-ca.crt"


def run_with_bind_mount(source: Path, target: Path, argv: list[str], *, what: str,
                        proc: Path | None = None) -> None:
    """Run `argv` with `source` bind-mounted on `target`, in a mount namespace of its own: the
    mount goes with the process, also when the build is killed (one made in the host's
    namespace outlived a killed build and kept its .tmp-rootfs-* undeletable). With `proc`,
    a procfs is mounted there too, in the same namespace: npm's install scripts never
    finish without one (node child processes), and Bun aborts without /proc/self."""
    bind_then_run = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
    args = [str(source), str(target)]
    if proc is not None:
        bind_then_run = ('mount --bind "$1" "$2" && mount -t proc proc "$3" && shift 3 && '
                         'exec "$@"')
        args.append(str(proc))
    run(["unshare", "--mount", "--propagation", "private", "sh", "-c", bind_then_run, "sh",
         *args, *argv], what=what)


@contextlib.contextmanager
def _host_network(root: Path) -> Iterator[str]:
    """While a package manager downloads inside `root`: names resolve as on the host, and
    what the host trusts is trusted (it may sit behind its own CA); yields that bundle's path
    in the root. The guest's resolv.conf comes back and the bundle goes after, so the guest
    keeps Debian's own certificate store."""
    resolv = root / "etc" / "resolv.conf"
    guest_resolv = resolv.read_bytes()
    resolv.write_bytes(Path("/etc/resolv.conf").read_bytes())
    host_ca = Path(os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
                   or "/etc/ssl/certs/ca-certificates.crt")
    ca_in_root = root / HOST_CA_IN_ROOT
    shutil.copyfile(host_ca, ca_in_root)
    try:
        yield f"/{HOST_CA_IN_ROOT}"
    finally:
        resolv.write_bytes(guest_resolv)
        ca_in_root.unlink(missing_ok=True)


def _pip_install(root: Path, packages: tuple[str, ...], cache: Path) -> None:
    """Install wheels into the guest's virtualenv with the guest's own pip (so they match its
    Python), downloading through the host's network; wheels are cached on the host."""
    cache.mkdir(parents=True, exist_ok=True)
    mount_point = root / PIP_CACHE_IN_ROOT
    mount_point.mkdir(parents=True, exist_ok=True)
    try:
        with _host_network(root) as ca:
            run_with_bind_mount(
                cache, mount_point,
                ["chroot", str(root), "/usr/bin/env", "-i", f"PATH=/{VENV}/bin:/usr/bin:/bin",
                 "HOME=/root", "LANG=C.UTF-8", f"/{VENV}/bin/pip", "install", "--quiet",
                 "--disable-pip-version-check", "--cert", ca,
                 "--cache-dir", f"/{PIP_CACHE_IN_ROOT}", *packages],
                what="pip install")
    finally:
        mount_point.rmdir()


def _npm_install(root: Path, packages: tuple[str, ...], cache: Path) -> None:
    """Install npm packages globally (/usr/local, on every PATH) with the guest's own node
    and npm, downloading through the host's network (Bun's package picks its binary for
    this libc and CPU in its install script); tarballs are cached on the host."""
    cache.mkdir(parents=True, exist_ok=True)
    mount_point = root / NPM_CACHE_IN_ROOT
    mount_point.mkdir(parents=True, exist_ok=True)
    try:
        with _host_network(root) as ca:
            run_with_bind_mount(
                cache, mount_point,
                ["chroot", str(root), "/usr/bin/env", "-i",
                 "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/root", "LANG=C.UTF-8",
                 "/usr/bin/npm", "install", "--global", "--no-audit", "--no-fund",
                 "--no-update-notifier", "--loglevel=error", "--cafile", ca,
                 "--cache", f"/{NPM_CACHE_IN_ROOT}", *packages],
                what="npm install", proc=root / "proc")
    finally:
        mount_point.rmdir()
        # npm's own files under root's home (its logs, update checks): not the guest's.
        shutil.rmtree(root / "root" / ".npm", ignore_errors=True)


def _customize(root: Path, agent: Mapping[str, bytes], init_script: bytes) -> None:
    root.chmod(0o755)
    agent_root = root / AGENT_ROOT
    _guest_dirs(agent_root)
    for rel, data in agent.items():
        dest = agent_root / rel
        _guest_dirs(dest.parent)
        dest.write_bytes(data)
        dest.chmod(0o644)
    if agent and (root / "usr/bin/python3").exists():
        # Byte-compile with the guest's own interpreter: the first start under TCG is faster.
        run(["chroot", root, "/usr/bin/python3", "-m", "compileall", "-q",
             "--invalidation-mode", "checked-hash", f"/{AGENT_ROOT}"], what="compileall")
    if (root / "usr/bin/python3").exists() and not (root / VENV / "bin/python").exists():
        # Debian marks its Python "externally managed": `pip install` as the sandbox user
        # would fail. A virtualenv first on PATH (seeing the system's packages) takes pip's
        # installs instead, so the loop agents run (pip install, then python) just works.
        run(["chroot", root, "/usr/bin/python3", "-m", "venv", "--system-site-packages",
             f"/{VENV}"], what="virtualenv")
        profile = root / "etc/profile.d/pandastack-venv.sh"
        profile.write_text(f'export PATH="/{VENV}/bin:$PATH"\n')
        profile.chmod(0o644)
    _e2b_user(root)
    login_profile_without_id_fork(root / "etc/profile")
    init = root / "sbin" / "pandastack-init"
    if init.is_symlink() or init.exists():
        init.unlink()
    init.write_bytes(init_script)
    init.chmod(0o755)
    (root / "work").mkdir(mode=0o755, exist_ok=True)
    (root / "work").chmod(0o755)
    etc = root / "etc"
    # Identity files are rewritten on every restore: /etc/hostname is the kernel's own
    # hostname, /etc/machine-id a file on /run (tmpfs), far cheaper to write than ext4.
    _replace_symlink(etc / "hostname", "/proc/sys/kernel/hostname")
    _replace_file(
        etc / "hosts",
        f"127.0.0.1\tlocalhost\n127.0.1.1\t{HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n",
        0o644,
    )
    # The guest asks its gateway; the sandbox's namespace forwards DNS to the host's
    # upstream resolver, when its egress policy lets it out at all.
    _replace_file(etc / "resolv.conf", "nameserver 169.254.0.22\noptions timeout:2\n", 0o644)
    _replace_symlink(etc / "machine-id", "/run/pandastack/machine-id")
    dbus_id = root / "var" / "lib" / "dbus" / "machine-id"
    if dbus_id.exists() and not dbus_id.is_symlink():
        dbus_id.unlink()
    shutil.rmtree(root / "var" / "cache" / "apt" / "archives" / "partial", ignore_errors=True)
    for d in ("proc", "sys", "dev", "run", "tmp"):
        _guest_dirs(root / d)
    (root / "tmp").chmod(0o1777)


def login_profile_without_id_fork(profile: Path) -> None:
    """Debian's /etc/profile asks `$(id -u)` on every login shell: a fork and an exec, ~40 ms
    of a command's start under TCG, and E2B's SDKs start every command as `bash -l -c`. Bash
    knows its effective uid ($EUID); other shells, which do not set it, still ask `id`."""
    if not profile.is_file():
        return
    text = profile.read_text()
    profile.write_text(text.replace('"$(id -u)"', '"${EUID:-$(id -u)}"'))


def _e2b_user(root: Path) -> None:
    """The account E2B's SDKs run commands as unless told otherwise: `user` (uid 1000, home
    /home/user, a login shell), who may sudo without a password, as in E2B's own images. Our
    own API keeps running as root unless asked (docs/e2b.md)."""
    if b"\nuser:" not in b"\n" + (root / "etc/passwd").read_bytes():
        run(["chroot", root, "/usr/sbin/useradd", "--create-home", "--uid", "1000",
             "--shell", "/bin/bash", E2B_USER], what="useradd")
    if (root / VENV).is_dir():
        # `pip install` as that user goes to the venv first on PATH, as it does for root.
        run(["chroot", root, "/bin/chown", "-R", f"{E2B_USER}:{E2B_USER}", f"/{VENV}"],
            what="chown venv")
    sudoers = root / "etc/sudoers.d"
    if sudoers.is_dir():
        _replace_file(sudoers / "e2b-user", f"{E2B_USER} ALL=(ALL:ALL) NOPASSWD: ALL\n", 0o440)


def _guest_dirs(path: Path) -> None:
    """`mkdir -p` whose new directories are 0755 whatever the process umask is (the
    service's is 0077, host/file_modes.py): these modes are the guest's."""
    missing = []
    while not os.path.lexists(path):
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        directory.mkdir()
        directory.chmod(0o755)


def _replace_symlink(path: Path, target: str) -> None:
    if path.is_symlink() or path.exists():
        path.unlink()
    path.symlink_to(target)


def _replace_file(path: Path, text: str, mode: int) -> None:
    if path.is_symlink() or path.exists():
        path.unlink()
    path.write_text(text)
    path.chmod(mode)


def check_root() -> None:
    if os.geteuid() != 0:
        raise SetupError("building the guest image needs root (mmdebstrap, chroot, tar ownership)")


def missing_tools(tools: Sequence[str]) -> list[str]:
    return [t for t in tools if shutil.which(t) is None]
