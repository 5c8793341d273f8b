"""What a killed test run leaves behind, and its reaper.

A run killed by a timeout, ^C or kill -9 runs no teardown: its QEMUs keep running (they are
made to outlive their host, ADR 0037), and so do its S3 server, its PostgreSQL cluster and the
file servers in its network namespaces, all of them spoiling the timings of every later run.
Other sessions run tests on this machine at the same time, and xdist workers of one run start
at different moments, so age says nothing about whether something is still in use: each
leftover is named after the process that made it (`owned_tmpdir`, `pst-inet-<pid>`), and
`reap`, run when a session starts (tests/conftest.py), removes only those whose owner is gone.

Covered: directories made by `owned_tmpdir` under /tmp and /dev/shm (the session's state dir
with its VMMs and their network slots, PostgreSQL and S3 server dirs, the private runtime,
server and agent dirs of single tests), with every process whose command line or working
directory lies in them, the network slots (psn-N namespaces and their claims) of sandboxes
under them, and mounts in them; the `pst-inet-<pid>` namespaces with the processes inside.
Not covered: what carries no owner's pid (cgroups of killed VMs: the host's gc removes them;
directories made by plain mkdtemp), and leftovers of a process whose pid is in use again (a
reused pid looks alive: they wait for a later run).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pandastack.host.config import DEFAULT_NETWORK_CLAIMS, FORK_BUFFERS_ROOT, HostConfig
from pandastack.host.network.manager import (
    NETNS_REGISTRY,
    NetworkManager,
    Slot,
    list_netns,
    netns_id,
)

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"

DIR_KINDS: dict[str, Path | None] = {
    # the session's state dir (tests/conftest.py) and its -snapshots and -volumes
    "pst-": None,
    "psp-": SCRIPTS / "pg-cluster",  # PostgreSQL clusters (tests/services.py)
    "pandastack-s3-": SCRIPTS / "s3-server",  # S3 servers (tests/host/objects/s3_server.py)
    "ps-chromium-": None,  # the dashboard tests' browser profiles (tests/server/browser.py)
    # private runtimes, servers, agents and SDK homes of single tests or modules
    **dict.fromkeys((
        "pst-crash-", "psc-", "psd-", "pse-", "psf-", "psf-snap-", "psfb-", "psfb-snap-",
        "psfm-", "psfm-snap-", "psfm-stage-", "psh-", "pshp-", "pshp-snap-", "psk-", "psn-",
        "pso-", "psr-", "pss-", "psts-", "psts-rt-", "pse2b-", "pscli-", "psu-", "psv-",
        "pag-", "pat-", "pac-", "phc-", "ppa-", "prg-", "pun-", "pog-",
    )),
}
"""Name prefix of each kind of directory -> the script whose `stop DIR` takes it down (its
servers first), or None: killing what runs in it and removing it is enough."""

NETNS_KINDS = ("pst-inet-", "pse-inet-", "pog1-", "pog2-")
"""Network namespaces the tests make: `<kind><pid>`."""

DIR_PARENTS = (Path("/tmp"), Path("/dev/shm"))
KILL_WAIT_S = 10.0


def owned_tmpdir(prefix: str, parent: str = "/tmp") -> Path:
    """A new directory named after this process (`<prefix><pid>-<random>`), so that `reap`
    can tell when its owner is gone; `prefix` must be one of DIR_KINDS."""
    if prefix not in DIR_KINDS:
        raise ValueError(f"{prefix!r} is not a kind tests/leftovers.py knows (DIR_KINDS)")
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent))


def _owner_pattern(kinds: Iterable[str], after: str) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(k) for k in sorted(kinds, key=len, reverse=True))
    return re.compile(rf"^(?P<kind>{alternatives})(?P<pid>[1-9][0-9]*){after}")


# A directory's pid is followed by a dash (then mkdtemp's random part and any suffix, such as
# the state dir's -snapshots), so the older names (`pst-<random>`) never match; a namespace's
# ends its name.
DIR_OWNER = _owner_pattern(DIR_KINDS, "-")
NETNS_OWNER = _owner_pattern(NETNS_KINDS, "$")


def dead_owned(names: Iterable[str], live_pids: Container[int],
               pattern: re.Pattern[str] = DIR_OWNER) -> list[str]:
    """The names (of `pattern`'s kinds) whose owner process is not among `live_pids`."""
    dead = []
    for name in names:
        match = pattern.match(name)
        if match is not None and int(match["pid"]) not in live_pids:
            dead.append(name)
    return sorted(dead)


def users_of(dirs: Iterable[Path], procs: Iterable[tuple[int, list[str], str]],
             me: int) -> list[int]:
    """Pids (of `procs`: pid, argv, cwd) that name one of `dirs` in an argument or work in
    one; never `me`."""
    roots = [str(d) for d in dirs]

    def inside(text: str) -> bool:
        return any(text == r or text.startswith(r + "/") for r in roots)

    return sorted(pid for pid, argv, cwd in procs
                  if pid != me and (inside(cwd) or any(r in a for a in argv for r in roots)))


def claims_under(claims: dict[int, str], dirs: Iterable[Path]) -> list[int]:
    """Slot indexes whose owner (a sandbox dir, or a runtime's spare-slot dir) lies in one
    of `dirs`."""
    roots = [str(d) for d in dirs]
    return sorted(i for i, owner in claims.items()
                  if any(owner == r or owner.startswith(r + "/") for r in roots))


# -- the machine ---------------------------------------------------------------------------

def live_pids() -> set[int]:
    """Processes that run: a zombie (killed, its parent not yet told) owns nothing any more,
    unless it is the first thread of a process whose other threads still run."""
    live = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "Z" or len(os.listdir(f"/proc/{name}/task")) > 1:
                live.add(int(name))
        except (OSError, IndexError):
            continue  # gone
    return live


def _procs() -> Iterator[tuple[int, list[str], str]]:
    for pid in (int(n) for n in os.listdir("/proc") if n.isdigit()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue  # gone, or a kernel thread
        yield pid, argv.split("\0"), cwd


def _kill_and_wait(pids: Iterable[int]) -> None:
    """SIGKILL each, and wait (by pidfd: they are not our children) until they are gone."""
    fds = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # gone; not ours to kill
            os.close(fd)
            continue
        fds.append(fd)
    deadline = time.monotonic() + KILL_WAIT_S
    try:
        while fds and (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select(fds, [], [], left)
            for fd in ready:
                fds.remove(fd)
                os.close(fd)
    finally:
        for fd in fds:
            os.close(fd)


def _network() -> tuple[NetworkManager, dict[int, tuple[str, str]]]:
    """This network namespace's claims (ADR 0021): slot -> (owner, pool)."""
    claims_dir = DEFAULT_NETWORK_CLAIMS
    with contextlib.suppress(OSError, ValueError, KeyError):
        marker = json.loads((NETNS_REGISTRY / f"netns-{netns_id()}.json").read_text())
        claims_dir = Path(marker["claims"])
    manager = NetworkManager(claims_dir)
    found = {}
    for entry in claims_dir.glob("[0-9]*") if claims_dir.is_dir() else []:
        with contextlib.suppress(OSError, ValueError, KeyError):
            claim = json.loads(entry.read_text())
            found[int(entry.name)] = (str(claim["owner"]), str(claim["pool"]))
    return manager, found


def _fork_buffers_of(dirs: Iterable[Path]) -> list[Path]:
    """The fork buffers (tmpfs mounts, memory) of runtimes whose state dir was one of `dirs`
    or a directory in them: each is named after its runtime's state dir, not put under it."""
    names = {HostConfig(state_dir=sub).fork_buffer_dir.name
             for d in dirs for sub in _dirs_in(d, depth=3)}
    return [FORK_BUFFERS_ROOT / n for n in sorted(names) if (FORK_BUFFERS_ROOT / n).exists()]


def _dirs_in(top: Path, depth: int) -> Iterator[Path]:
    """`top` and the directories under it, `depth` levels down at most."""
    yield top
    if depth > 0:
        with contextlib.suppress(OSError):
            for entry in os.scandir(top):
                if entry.is_dir(follow_symlinks=False):
                    yield from _dirs_in(Path(entry.path), depth - 1)


def _mounts_in(dirs: Iterable[Path]) -> list[str]:
    roots = [str(d) for d in dirs]
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if any(point == r or point.startswith(r + "/") for r in roots):
            points.append(point)
    return sorted(points, key=len, reverse=True)  # the innermost first


def _run(*argv: str) -> None:
    subprocess.run(list(argv), capture_output=True, timeout=120, check=False)


@dataclass
class Reaped:
    dirs: list[Path]
    netns: list[str]
    processes: list[int]
    slots: list[int]
    mounts: list[str]

    def __bool__(self) -> bool:
        return bool(self.dirs or self.netns)


def reap(say: Callable[[str], None] = lambda line: None) -> Reaped:
    """Remove what test runs whose process is gone left behind (see the module's text)."""
    live = live_pids()
    dirs = [parent / name for parent in DIR_PARENTS if parent.is_dir()
            for name in dead_owned(os.listdir(parent), live)]
    namespaces = dead_owned(list_netns(), live, NETNS_OWNER)
    reaped = Reaped(dirs, namespaces, [], [], [])
    if not reaped:
        return reaped
    for d in dirs:
        match = DIR_OWNER.match(d.name)
        stop = DIR_KINDS[match["kind"]] if match is not None else None
        if stop is not None and d.is_dir():
            _run(str(stop), "stop", str(d))  # its servers first, the way they stop
    for ns in namespaces:
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                             check=False)
        reaped.processes += [int(p) for p in out.stdout.split()]
    reaped.processes += users_of(dirs, _procs(), os.getpid())
    _kill_and_wait(reaped.processes)
    manager, claims = _network()
    reaped.slots = claims_under({i: owner for i, (owner, _) in claims.items()}, dirs)
    for index in reaped.slots:
        slot = Slot(index, claims[index][1])
        manager.teardown(slot)
        manager.release(slot)
    for ns in namespaces:
        _run("ip", "netns", "del", ns)
    buffers = _fork_buffers_of(dirs)
    reaped.mounts = [*map(str, buffers), *_mounts_in(dirs)]
    for point in reaped.mounts:
        _run("umount", "--lazy", point)  # the kernel frees it once nothing uses it
    for d in [*buffers, *dirs]:
        shutil.rmtree(d, ignore_errors=True)
    say(f"reaped leftovers of killed test runs: {len(dirs)} directories "
        f"({', '.join(d.name for d in dirs)}), {len(namespaces)} namespaces, "
        f"{len(reaped.processes)} processes, {len(reaped.slots)} network slots, "
        f"{len(reaped.mounts)} mounts")
    return reaped
