"""Guest kernel: resolve Debian's current `linux-image-<ver>-amd64`, download and unpack it.

Only `boot/vmlinuz-*` and the few `.ko` files the initramfs loads are kept. The package ships no
`modules.dep` (depmod runs in its postinst), so dependencies come from each module's `.modinfo`
ELF section (`depends=`, which modpost writes from the same symbol resolution depmod uses).
"""

from __future__ import annotations

import contextlib
import json
import lzma
import os
import re
import shutil
import struct
import tempfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pandastack.host.images.common import (
    atomic_dir,
    hash_json,
    run,
    sha256_bytes,
    write_atomic,
)
from pandastack.hostport.errors import SetupError

META_PACKAGE = "linux-image-amd64"
# Bump when the layout of a kernel cache directory changes.
KERNEL_RECIPE = 2

Progress = Callable[[str], None]


@dataclass(frozen=True)
class KernelPackage:
    name: str  # e.g. "linux-image-6.1.0-57-amd64"
    version: str  # Debian version, e.g. "6.1.192-3"


@dataclass(frozen=True)
class KernelArtifacts:
    vmlinuz: Path  # the bzImage as Debian ships it
    boot_kernel: Path  # what to pass to -kernel: uncompressed PVH vmlinux if possible, else vmlinuz
    kernel_version: str  # uname -r, e.g. "6.1.0-57-amd64"
    modules: tuple[Path, ...]  # .ko files in load order


# --- resolving the package ------------------------------------------------------------------


def apt_config(*keys: str) -> dict[str, str]:
    """Values of apt configuration keys (as apt itself resolves them); unset keys are absent."""
    args: list[str] = ["apt-config", "shell"]
    for i, key in enumerate(keys):
        args += [f"V{i}", key]
    out = run(args, what="apt-config")
    values: dict[str, str] = {}
    for line in out.splitlines():
        m = re.fullmatch(r"V(\d+)='(.*)'", line.strip())
        if m:
            values[keys[int(m.group(1))]] = m.group(2).replace("'\\''", "'")
    return values


def _apt_lists_fingerprint() -> str:
    """Changes whenever `apt-get update` changed the package indexes (cheap: stat only)."""
    lists = Path(apt_config("Dir::State::lists/d").get("Dir::State::lists/d", "/var/lib/apt/lists"))
    entries: list[tuple[str, int, int]] = []
    if lists.is_dir():
        for e in os.scandir(lists):
            if e.is_file():
                st = e.stat()
                entries.append((e.name, st.st_size, st.st_mtime_ns))
    return hash_json(sorted(entries))


def _lookup_meta() -> KernelPackage | None:
    try:
        out = run(["apt-cache", "show", "--no-all-versions", META_PACKAGE], what="apt-cache")
    except SetupError:
        return None
    m = re.search(r"^Depends:\s*(.*)$", out, re.MULTILINE)
    if not m:
        return None
    for dep in m.group(1).split(","):
        dm = re.fullmatch(r"\s*(linux-image-[0-9][^\s(]*)\s*(?:\(\s*=\s*([^\s)]+)\s*\))?\s*", dep)
        if dm:
            name, version = dm.group(1), dm.group(2)
            if version is None:
                pol = run(["apt-cache", "policy", name], what="apt-cache")
                vm = re.search(r"Candidate:\s*(\S+)", pol)
                if not vm or vm.group(1) == "(none)":
                    return None
                version = vm.group(1)
            return KernelPackage(name, version)
    return None


def resolve_kernel_package(
    cache: Path, progress: Progress, *, refresh: bool = False
) -> KernelPackage:
    """The exact kernel package `linux-image-amd64` depends on.

    apt-cache takes ~0.6 s on hosts that disable apt's binary cache, so the answer is memoised in
    `cache/resolved.json` keyed by a stat fingerprint of apt's lists directory.
    """
    memo = cache / "resolved.json"
    fingerprint = _apt_lists_fingerprint()
    if not refresh:
        try:
            data = json.loads(memo.read_text())
            if data["fingerprint"] == fingerprint:
                return KernelPackage(data["name"], data["version"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    pkg = _lookup_meta()
    if pkg is None or refresh:
        progress("kernel: package lookup failed, running apt-get update" if pkg is None
                 else "kernel: running apt-get update")
        run(["apt-get", "update", "-q"], what="apt-get update")
        fingerprint = _apt_lists_fingerprint()
        pkg = _lookup_meta()
        if pkg is None:
            raise SetupError(f"cannot resolve the kernel package behind {META_PACKAGE} via apt")
    cache.mkdir(parents=True, exist_ok=True)
    write_atomic(
        memo,
        json.dumps({"fingerprint": fingerprint, "name": pkg.name, "version": pkg.version}).encode(),
    )
    return pkg


# --- module metadata ------------------------------------------------------------------------


def normalize_module(name: str) -> str:
    return name.replace("-", "_")


def read_modinfo(ko: bytes) -> dict[str, str]:
    """Key/value pairs of the `.modinfo` section of an (uncompressed, ELF64 LE) kernel module."""
    if ko[:4] != b"\x7fELF" or ko[4] != 2 or ko[5] != 1:
        raise SetupError("kernel module is not a little-endian ELF64 file")
    (shoff,) = struct.unpack_from("<Q", ko, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", ko, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", ko, shoff + i * shentsize) for i in range(shnum)]
    strtab = sections[shstrndx][4]
    info: dict[str, str] = {}
    for sh in sections:
        start = strtab + sh[0]
        if ko[start : ko.index(b"\0", start)] == b".modinfo":
            for item in ko[sh[4] : sh[4] + sh[5]].split(b"\0"):
                key, sep, value = item.decode("utf-8", "replace").partition("=")
                if sep and key not in info:
                    info[key] = value
    return info


def module_dependencies(info: Mapping[str, str]) -> list[str]:
    return [normalize_module(d) for d in info.get("depends", "").split(",") if d]


def order_modules(wanted: Sequence[str], deps: Mapping[str, Sequence[str]]) -> list[str]:
    """Modules to load so that each comes after all its (transitive) dependencies.

    Keeps the order of `wanted` where dependencies allow; pulls in unlisted dependencies.
    """
    order: list[str] = []
    state: dict[str, int] = {}  # 1 = visiting, 2 = done

    def visit(mod: str) -> None:
        if state.get(mod) == 2:
            return
        if state.get(mod) == 1:
            raise SetupError(f"kernel module dependency cycle at {mod}")
        if mod not in deps:
            raise SetupError(f"kernel module {mod} not found in the kernel package")
        state[mod] = 1
        for dep in deps[mod]:
            visit(dep)
        state[mod] = 2
        order.append(mod)

    for mod in wanted:
        visit(normalize_module(mod))
    return order


# --- download and extraction ----------------------------------------------------------------


def kernel_key(pkg: KernelPackage, modules: Sequence[str]) -> str:
    return hash_json(
        {
            "recipe": KERNEL_RECIPE,
            "package": pkg.name,
            "version": pkg.version,
            "modules": list(modules),
        }
    )


def _download_deb(debs: Path, pkg: KernelPackage, progress: Progress) -> Path:
    debs.mkdir(parents=True, exist_ok=True)
    final = debs / f"{pkg.name}_{pkg.version.replace(':', '%3a')}.deb"
    if final.exists():
        return final
    progress(f"kernel: downloading {pkg.name} {pkg.version}")
    with tempfile.TemporaryDirectory(dir=debs, prefix=".tmp-dl-") as tmp:
        run(["apt-get", "download", "-q", f"{pkg.name}={pkg.version}"], cwd=Path(tmp),
            what="apt-get download")
        got = list(Path(tmp).glob("*.deb"))
        if len(got) != 1:
            raise SetupError(f"apt-get download of {pkg.name} produced {len(got)} files")
        os.rename(got[0], final)
    return final


def ensure_kernel(
    cache: Path, pkg: KernelPackage, modules: Sequence[str], progress: Progress
) -> KernelArtifacts:
    """vmlinuz + ordered .ko files, cached in `cache/<key>/`."""
    final = cache / kernel_key(pkg, modules)
    if not (final / "kernel.json").exists():
        deb = _download_deb(cache / "debs", pkg, progress)
        progress(f"kernel: extracting vmlinuz and {len(modules)} modules")
        with (
            atomic_dir(final) as out,
            tempfile.TemporaryDirectory(dir=cache, prefix=".tmp-x-") as scratch,
        ):
            _extract(deb, Path(scratch), out, modules)
    meta = json.loads((final / "kernel.json").read_text())
    return KernelArtifacts(
        vmlinuz=final / "vmlinuz",
        boot_kernel=final / meta["boot_kernel"],
        kernel_version=meta["kernel_version"],
        modules=tuple(final / "modules" / f"{m}.ko" for m in meta["load_order"]),
    )


def _extract(deb: Path, scratch: Path, out: Path, wanted: Sequence[str]) -> None:
    run(["dpkg-deb", "-x", deb, scratch], what="dpkg-deb")
    vmlinuz = sorted((scratch / "boot").glob("vmlinuz-*"))
    if len(vmlinuz) != 1:
        raise SetupError(f"expected one boot/vmlinuz-* in {deb.name}, found {len(vmlinuz)}")
    kver = vmlinuz[0].name.removeprefix("vmlinuz-")
    moddir = scratch / "lib" / "modules" / kver
    if not moddir.is_dir():
        raise SetupError(f"{deb.name} has no lib/modules/{kver}")
    paths: dict[str, Path] = {}
    for ko in (moddir / "kernel").rglob("*.ko"):
        paths.setdefault(normalize_module(ko.name.removesuffix(".ko")), ko)
    builtin = _builtin_modules(moddir)
    deps: dict[str, list[str]] = {}
    blobs: dict[str, bytes] = {}

    def load(mod: str) -> None:
        if mod in deps:
            return
        if mod not in paths:
            if mod in builtin:
                deps[mod] = []
                return
            raise SetupError(f"kernel module {mod}.ko not found in {deb.name}")
        blobs[mod] = paths[mod].read_bytes()
        deps[mod] = module_dependencies(read_modinfo(blobs[mod]))
        for dep in deps[mod]:
            load(dep)

    for mod in wanted:
        load(normalize_module(mod))
    order = [m for m in order_modules(wanted, deps) if m in blobs]
    (out / "modules").mkdir()
    for mod in order:
        (out / "modules" / f"{mod}.ko").write_bytes(blobs[mod])
    shutil.copyfile(vmlinuz[0], out / "vmlinuz")
    elf = extract_pvh_vmlinux(vmlinuz[0].read_bytes())
    if elf is not None:
        (out / "vmlinux").write_bytes(elf)
    meta = {
        "package": deb.name,
        "kernel_version": kver,
        "boot_kernel": "vmlinux" if elf is not None else "vmlinuz",
        "load_order": order,
        "depends": {m: deps[m] for m in order},
        "vmlinuz_sha256": sha256_bytes((out / "vmlinuz").read_bytes()),
    }
    (out / "kernel.json").write_text(json.dumps(meta, indent=2) + "\n")


def _builtin_modules(moddir: Path) -> set[str]:
    path = moddir / "modules.builtin"
    if not path.exists():
        return set()
    return {
        normalize_module(Path(line.strip()).name.removesuffix(".ko"))
        for line in path.read_text().splitlines()
        if line.strip()
    }


# --- uncompressed PVH kernel ----------------------------------------------------------------

_XEN_ELFNOTE_PHYS32_ENTRY = 18


def extract_pvh_vmlinux(bzimage: bytes) -> bytes | None:
    """The uncompressed ELF kernel inside a bzImage, if it has a PVH entry point (else None).

    QEMU's microvm boots such an ELF directly through PVH. Under TCG this skips decompressing
    the xz payload with emulated instructions, which costs several seconds per cold boot.
    """
    candidates: list[bytes] = []
    pos = bzimage.find(b"\xfd7zXZ\x00")
    if pos >= 0:
        with contextlib.suppress(lzma.LZMAError):
            candidates.append(lzma.LZMADecompressor().decompress(bzimage[pos:]))
    pos = bzimage.find(b"\x1f\x8b\x08\x00")
    while pos >= 0 and not candidates:
        try:
            candidates.append(zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(bzimage[pos:]))
        except zlib.error:
            pos = bzimage.find(b"\x1f\x8b\x08\x00", pos + 1)
    for elf in candidates:
        if has_pvh_note(elf):
            return elf
    return None


def has_pvh_note(elf: bytes) -> bool:
    """Whether an ELF64 LE file carries the Xen PHYS32_ENTRY note (PVH boot entry)."""
    if len(elf) < 64 or elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        return False
    (phoff,) = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    for i in range(phnum):
        p_type, _flags, p_offset, _va, _pa, p_filesz = struct.unpack_from(
            "<IIQQQQ", elf, phoff + i * phentsize
        )
        if p_type != 4:  # PT_NOTE
            continue
        pos, end = p_offset, p_offset + p_filesz
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", elf, pos)
            name = elf[pos + 12 : pos + 12 + namesz].rstrip(b"\0")
            if name == b"Xen" and ntype == _XEN_ELFNOTE_PHYS32_ENTRY:
                return True
            pos += 12 + ((namesz + 3) & ~3) + ((descsz + 3) & ~3)
    return False
