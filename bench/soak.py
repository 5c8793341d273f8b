"""Soak (issue 22): N create -> write -> exec -> read -> kill cycles from C concurrent SDK
clients against a live server booting real VMs, then a look for anything left behind.

The server is a real `pandastack serve` subprocess with everything private under a temporary
directory (state dir, SQLite database, client config: `api.live_server`), its host in-process;
with `--agent` it drives a real `pandastack agent` subprocess on a unix socket instead (the
split shape, `api.live_agent`). Each client is a thread with its own sync `Client`. A cycle:
create a `base` sandbox, write a file of random text, exec `tr` over it into a second file,
read that back and compare, kill. A failed cycle counts as an error (the first few messages are
printed) and its sandbox is killed if it was made.

At the end, with the server still up and then again after its SIGTERM:

- VMM processes whose command line names the temporary directory (`tests.helpers`), among
  them those whose directory is gone (`host.gc.orphan_vmms`: named apart);
- network namespaces `psn-N` and host veths `psvN` with no claim in the host's claims dir, and
  claims owned by a path under the temporary directory other than the runtime's spare slots
  (after the stop: any claim under it);
- tun/tap devices in the host's network namespace that were not there at the start;
- mounts whose mount point is under the temporary directory;
- entries in the sandboxes dir other than the runtime's own (`.spare-slots`, the agent's socket
  and token);
- database rows of sandboxes in a live state (`store.repo.LIVE_STATES`).

RSS of the server (and of the agent) is read from /proc at the start, after the warm-up (the
first `--warmup` cycles) and at the end. Exit status 1 on any error or leftover.

Usage: python bench/soak.py [--cycles 1000] [--clients 4] [--max-minutes 60] [--agent]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.helpers

from tests.helpers import vmm_pids_under as vmm_pids_under

from api import Server, live_agent, live_server
from common import line
from pandastack import Client
from pandastack.host.config import HUGETLB_CLAIMS_ROOT, HostConfig
from pandastack.host.gc import orphan_vmms
from pandastack.host.memory.huge_pool import claimed_pages, persistent_pages
from pandastack.host.network.manager import HOST_VETH_PREFIX, NS_PREFIX, list_netns
from pandastack.server.store.repo import LIVE_STATES

MAX_CYCLES = 100_000
MAX_CLIENTS = 64
SHOWN_ERRORS = 5
# What a runtime keeps in its sandboxes dir while it has no sandbox.
OWN_ENTRIES = {".spare-slots", "agent.sock", "agent.token", "agent.log"}


# -- what a process and the host look like ----------------------------------------------------

def pid_with_args(*fragments: str) -> int | None:
    """The one live process whose command line holds every fragment (None: none)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        if all(any(f in w for w in words) for f in fragments):
            return int(proc.name)
    return None


def rss_mib(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        for row in Path(f"/proc/{pid}/status").read_text().splitlines():
            if row.startswith("VmRSS:"):
                return int(row.split()[1]) / 1024
    except OSError:
        pass
    return None


def host_taps() -> set[str]:
    """tun/tap devices in this (the host's) network namespace."""
    net = Path("/sys/class/net")
    return {d.name for d in net.iterdir() if (d / "tun_flags").exists()}


@dataclass(frozen=True)
class Baseline:
    """What belonged to others when the run began (the machine is shared)."""

    taps: frozenset[str]
    huge_pages: int  # the hugetlb pool's persistent pages no claim names

    @classmethod
    def now(cls) -> Baseline:
        return cls(frozenset(host_taps()), unclaimed_huge_pages())


def unclaimed_huge_pages() -> int:
    """The kernel's hugetlb pool, persistent pages, beyond what the runtimes' claims name:
    pages a runtime added and nobody will take back (0 where there is no pool)."""
    try:
        persistent = persistent_pages()
    except OSError:
        return 0
    claimed = sum(claimed_pages(claim) for claim in HUGETLB_CLAIMS_ROOT.glob("*.claim"))
    return max(0, persistent - claimed)


def claims(claims_dir: Path) -> dict[int, str]:
    found: dict[int, str] = {}
    for entry in claims_dir.glob("*") if claims_dir.is_dir() else []:
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = entry.read_text()
            except OSError:
                continue  # released while we looked
    return found


def leftovers(tmp: Path, sandboxes: Path, db: Path | None, base: Baseline,
              stopped: bool) -> list[str]:
    """Everything of this run still on the machine (see the module docstring)."""
    # Others' tests on this machine may leave orphans of their own for their gc to find.
    orphans = {pid: wd for pid, wd in orphan_vmms() if str(wd).startswith(str(tmp))}
    left = [f"orphan VMM pid {pid} (its directory {wd} is gone)" for pid, wd in orphans.items()]
    left += [f"VMM pid {pid} under {tmp}" for pid in vmm_pids_under(tmp) if pid not in orphans]
    claims_dir = HostConfig.from_env().network_claims_dir
    held = claims(claims_dir)
    for index, owner in sorted(held.items()):
        if str(tmp) in owner and (stopped or ".spare-slots" not in owner):
            left.append(f"network claim {index} owned by {owner}")
    # A namespace is built only after its claim exists and removed before its release, so
    # one without a claim is a leftover whoever made it: read the claims again to be sure.
    unclaimed = [n for n in list_netns() if n.startswith(NS_PREFIX)
                 and n[len(NS_PREFIX):].isdigit() and int(n[len(NS_PREFIX):]) not in held]
    again = claims(claims_dir)
    left += [f"namespace {n} without a claim" for n in unclaimed
             if int(n[len(NS_PREFIX):]) not in again]
    veths = [d.name for d in Path("/sys/class/net").iterdir()
             if d.name.startswith(HOST_VETH_PREFIX) and d.name[len(HOST_VETH_PREFIX):].isdigit()]
    left += [f"host veth {v} without a claim" for v in veths
             if int(v[len(HOST_VETH_PREFIX):]) not in again
             and int(v[len(HOST_VETH_PREFIX):]) not in claims(claims_dir)]
    left += [f"tap {t} in the host namespace" for t in sorted(host_taps() - base.taps)]
    if stopped and (extra := unclaimed_huge_pages() - base.huge_pages) > 0:
        left.append(f"{extra} hugetlb pool pages no runtime's claim names")
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    left += [f"mount {m.split()[4]}" for m in mounts if m.split()[4].startswith(str(tmp))]
    if sandboxes.is_dir():
        left += [f"file {sandboxes / e.name}" for e in sandboxes.iterdir()
                 if e.name not in OWN_ENTRIES]
    if db is not None and db.exists():
        with contextlib.closing(sqlite3.connect(db)) as conn:
            marks = ",".join("?" * len(LIVE_STATES))
            rows = conn.execute(f"SELECT id, state FROM sandboxes WHERE state IN ({marks})",
                                LIVE_STATES).fetchall()
        left += [f"database row {sid} in state {state}" for sid, state in rows]
    return left


def print_leftovers(live: list[str], stopped: list[str]) -> None:
    """What `leftovers` found with the server up and after its SIGTERM, one per line."""
    for when, items in (("with the server up", live), ("after its SIGTERM", stopped)):
        print(f"leftovers {when}: {len(items)}")
        for item in items:
            print(f"  {item}")


# -- the cycles ----------------------------------------------------------------------------------

@dataclass
class Run:
    cycles: int
    deadline: float
    warmup: int
    on_warm: threading.Event = field(default_factory=threading.Event)
    started: int = 0
    done: int = 0
    times: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self) -> bool:
        with self.lock:
            if self.started >= self.cycles or time.monotonic() > self.deadline:
                return False
            self.started += 1
            return True

    def finish(self, seconds: float | None, error: str | None) -> None:
        with self.lock:
            self.done += 1
            if error is None and seconds is not None:
                self.times.append(seconds)
            else:
                self.errors.append(error or "?")
            if self.done == self.warmup:
                self.on_warm.set()
            if self.done % 100 == 0:
                print(f"  {self.done} cycles, {len(self.errors)} errors", flush=True)


def cycle(client: Client) -> float:
    text = secrets.token_hex(512)
    started = time.perf_counter()
    sbx = client.sandboxes.create(template="base", ttl_seconds=600)
    try:
        sbx.files.write("/tmp/soak-in", text)
        result = sbx.exec(["sh", "-c", "tr a-f A-F < /tmp/soak-in > /tmp/soak-out"])
        if result.exit_code != 0:
            raise RuntimeError(f"exec exit {result.exit_code}: {result.stderr[-300:]}")
        got = sbx.files.read("/tmp/soak-out", format="text")
        if got != text.upper():
            raise RuntimeError(f"read back {len(got)} chars, not the {len(text)} expected")
    finally:
        client.sandboxes.kill(sbx.id)
    return time.perf_counter() - started


def worker(server: Server, run: Run) -> None:
    with Client(server.api_url, server.api_key) as client:
        while run.take():
            try:
                run.finish(cycle(client), None)
            except Exception as exc:  # every failure is a figure of the soak
                run.finish(None, f"{type(exc).__name__}: {exc}"[:400])


@contextlib.contextmanager
def server_for(tmp: Path, agent: bool) -> Iterator[tuple[Server, dict[str, int | None]]]:
    """The live server (over a live agent with `agent`) and the pids to watch."""
    with contextlib.ExitStack() as stack:
        agent_dir = tmp / "agent"
        drive = None
        if agent:
            agent_dir.mkdir()
            stack.enter_context(live_agent(agent_dir))
            drive = (f"unix:{agent_dir / 'agent.sock'}", agent_dir / "agent.token")
        (tmp / "server").mkdir()
        server = stack.enter_context(live_server(tmp / "server", drive))
        port = server.api_url.rsplit(":", 1)[1]
        pids = {"server": pid_with_args("serve", "--port", port)}
        if agent:
            pids["agent"] = pid_with_args("agent", f"unix:{agent_dir / 'agent.sock'}")
        yield server, pids


def fmt_rss(samples: list[dict[str, float | None]], name: str) -> str:
    values = ["-" if s.get(name) is None else f"{s[name]:.0f} MiB" for s in samples]
    return f"{name} RSS: start {values[0]}, after warm-up {values[1]}, end {values[2]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--cycles", type=int, default=1000, help=f"<= {MAX_CYCLES}")
    parser.add_argument("--clients", type=int, default=4, help=f"<= {MAX_CLIENTS}")
    parser.add_argument("--max-minutes", type=float, default=60.0,
                        help="start no cycle after this long (the run then reports)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="cycles before the 'after warm-up' RSS (default: 10%%, >= clients)")
    parser.add_argument("--agent", action="store_true",
                        help="the server drives a separate `pandastack agent`")
    args = parser.parse_args()
    if not 1 <= args.cycles <= MAX_CYCLES or not 1 <= args.clients <= MAX_CLIENTS:
        parser.error(f"--cycles in 1..{MAX_CYCLES}, --clients in 1..{MAX_CLIENTS}")
    warmup = args.warmup if args.warmup is not None else max(args.clients, args.cycles // 10)
    warmup = min(max(1, warmup), args.cycles)
    base = Baseline.now()
    tmp = Path(tempfile.mkdtemp(prefix="psk-", dir="/tmp"))
    sandboxes = (tmp / "agent" if args.agent else tmp / "server") / "sandboxes"
    db = tmp / "server" / "pandastack.db"
    rss: list[dict[str, float | None]] = []
    run = Run(args.cycles, 0.0, warmup)
    left_live: list[str] = []
    try:
        with server_for(tmp, args.agent) as (server, pids):
            print(f"state under {tmp}")
            print(f"server up at {server.api_url} (pids {pids}); {args.cycles} cycles, "
                  f"{args.clients} clients, warm-up {warmup}, at most {args.max_minutes} min")
            rss.append({k: rss_mib(p) for k, p in pids.items()})
            run.deadline = time.monotonic() + args.max_minutes * 60
            began = time.monotonic()
            threads = [threading.Thread(target=worker, args=(server, run), daemon=True)
                       for _ in range(args.clients)]
            for t in threads:
                t.start()
            run.on_warm.wait(timeout=args.max_minutes * 60 + 600)
            rss.append({k: rss_mib(p) for k, p in pids.items()})
            for t in threads:
                t.join()
            wall = time.monotonic() - began
            rss.append({k: rss_mib(p) for k, p in pids.items()})
            left_live = leftovers(tmp, sandboxes, db, base, stopped=False)
        left_stopped = leftovers(tmp, sandboxes, None, base, stopped=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load = os.getloadavg()
    print(f"\ncycles done {run.done} of {args.cycles} in {wall:.0f} s "
          f"({args.clients} clients{', over an agent' if args.agent else ''}); "
          f"load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"errors {len(run.errors)}")
    for message in run.errors[:SHOWN_ERRORS]:
        print(f"  {message}")
    if run.times:
        print(line("cycle create+write+exec+read+kill", run.times, "s"))
    for name in rss[0]:
        print(fmt_rss(rss, name))
    print_leftovers(left_live, left_stopped)
    short = run.done < args.cycles
    if short:
        print(f"stopped at the {args.max_minutes} min bound")
    return 1 if run.errors or left_live or left_stopped else 0


if __name__ == "__main__":
    sys.exit(main())
