"""Density (issue 22): K sandboxes running at once on this machine, each answering an exec;
what they cost while they sit idle.

A live server (`api.live_server`: `pandastack serve` with its host in-process, everything
private under a temporary directory) creates K `base` sandboxes through the SDK, `--parallel`
creates at a time. When the host's admission (ADR 0050) refuses a create (503, the host low
on memory), creating stops there: the K reached and the refusal's message are reported, and
the sandboxes made are measured as below (the stop is the expected end of a `--k` above what
the host holds, not a failure). Creating stops early, with a clear message and exit status 1,
when a create fails otherwise, MemAvailable falls under `--reserve-mib` (a safety net under
the server's reserve, for an admission that did not stop in time), or the time bound passes.
Then every sandbox runs `echo ok`, and the script reports:

- PSS per sandbox: the sum of `Pss` in /proc/PID/smaps_rollup of each VMM process, over K
  (shared template pages are split between the processes that map them), beside RSS;
- host memory used (MemTotal - MemAvailable) before and with K running, and the difference
  over K; creates per second with `--parallel` clients;
- the kernel's OOM kills during the run (`oom_kill` in /proc/vmstat before and after: any is
  a failure, whatever it killed);
- host CPU while all K sit idle for `--idle-seconds`, from /proc/stat (busy share of all
  cores; the machine is shared, so the same window is measured before the creates too), and
  the VMM processes' own CPU over that window (utime + stime from /proc/PID/stat), in cores.

Then all are killed and the leftover checks of `soak.py` run (with the server up, and after its
SIGTERM). Exit status 1 on a shortfall, an exec that did not answer, or a leftover.

Usage: python bench/density.py [--k 100] [--parallel 4] [--idle-seconds 30] [--max-minutes 30]
       [--server-reserve-mb MiB]   (PANDASTACK_MEMORY_RESERVE_MB of the server; its default)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from api import live_server
from pandastack import Client, Sandbox
from pandastack.sdk.errors import ServerError
from soak import Baseline, leftovers, print_leftovers, vmm_pids_under

MAX_K = 1000
CLK_TCK = os.sysconf("SC_CLK_TCK")


def meminfo() -> dict[str, int]:
    """/proc/meminfo in KiB."""
    values = {}
    for row in Path("/proc/meminfo").read_text().splitlines():
        name, rest = row.split(":", 1)
        values[name] = int(rest.split()[0])
    return values


def used_mib() -> float:
    info = meminfo()
    return (info["MemTotal"] - info["MemAvailable"]) / 1024


def oom_kills() -> int:
    """The kernel's OOM kills since boot (/proc/vmstat `oom_kill`); -1 where not counted."""
    for row in Path("/proc/vmstat").read_text().splitlines():
        name, _, value = row.partition(" ")
        if name == "oom_kill":
            return int(value)
    return -1


def admission_refused(exc: Exception) -> bool:
    """The host's memory admission said no (ADR 0050): 503 naming MemAvailable."""
    return isinstance(exc, ServerError) and exc.status == 503 and "MemAvailable" in str(exc)


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all cores."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # guest time is already inside user
    return total - idle, total


def proc_cpu(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    after = stat.rsplit(")", 1)[1].split()
    return int(after[11]) + int(after[12])  # utime, stime


def smaps(pid: int) -> tuple[int, int]:
    """(Pss, Rss) of a process, KiB."""
    pss = rss = 0
    try:
        for row in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if row.startswith("Pss:"):
                pss = int(row.split()[1])
            elif row.startswith("Rss:"):
                rss = int(row.split()[1])
    except OSError:
        pass
    return pss, rss


def idle_window(seconds: float, pids: list[int]) -> tuple[float, float]:
    """(host busy share of all cores, cores used by `pids`) over `seconds`."""
    busy0, total0 = cpu_times()
    own0 = sum(proc_cpu(p) for p in pids)
    t0 = time.monotonic()
    time.sleep(seconds)
    busy1, total1 = cpu_times()
    own1 = sum(proc_cpu(p) for p in pids)
    elapsed = time.monotonic() - t0
    return (busy1 - busy0) / max(1, total1 - total0), (own1 - own0) / CLK_TCK / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--k", type=int, default=100, help=f"sandboxes at once (<= {MAX_K})")
    parser.add_argument("--parallel", type=int, default=4, help="creates at a time")
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--max-minutes", type=float, default=30.0,
                        help="bound on creating and checking the K sandboxes")
    parser.add_argument("--reserve-mib", type=int, default=512,
                        help="stop creating (a failure) when MemAvailable falls under this: "
                             "a safety net under the server's own reserve")
    parser.add_argument("--server-reserve-mb", type=int, default=None,
                        help="the server's PANDASTACK_MEMORY_RESERVE_MB (default: its own, "
                             "5%% of MemTotal, at least 1024)")
    parser.add_argument("--vcpus", type=int, default=None)
    parser.add_argument("--memory-mb", type=int, default=None,
                        help="a size class (default: the template's own, 512 for base)")
    args = parser.parse_args()
    if not 1 <= args.k <= MAX_K or not 1 <= args.parallel <= 32:
        parser.error(f"--k in 1..{MAX_K}, --parallel in 1..32")
    base = Baseline.now()
    tmp = Path(tempfile.mkdtemp(prefix="psd-", dir="/tmp"))
    (tmp / "server").mkdir()
    made: list[Sandbox] = []
    lock = threading.Lock()
    failure: list[str] = []
    refused: list[str] = []  # the admission's 503: where creating stops
    failed = 1
    oom_before = oom_kills()
    env = {} if args.server_reserve_mb is None else \
        {"PANDASTACK_MEMORY_RESERVE_MB": str(args.server_reserve_mb)}
    try:
        with live_server(tmp / "server", extra_env=env) as server, \
                Client(server.api_url, server.api_key) as client:
            print(f"server up at {server.api_url}; K={args.k}, {args.parallel} creates at a "
                  f"time, load average {os.getloadavg()[0]:.2f}, MemAvailable "
                  f"{meminfo()['MemAvailable'] // 1024} MiB, OOM kills so far {oom_before}")
            before_used = used_mib()
            before_busy, _ = idle_window(min(10.0, args.idle_seconds), [])
            deadline = time.monotonic() + args.max_minutes * 60

            def create_one(_: int) -> None:
                if failure or refused:
                    return
                if time.monotonic() > deadline:
                    failure.append(f"the {args.max_minutes} min bound passed")
                    return
                available = meminfo()["MemAvailable"] // 1024
                if available < args.reserve_mib:
                    failure.append(f"MemAvailable {available} MiB < reserve "
                                   f"{args.reserve_mib} MiB")
                    return
                try:
                    sbx = client.sandboxes.create(template="base", ttl_seconds=3600,
                                                  vcpus=args.vcpus, memory_mb=args.memory_mb)
                except Exception as exc:
                    if admission_refused(exc):
                        refused.append(str(exc))
                    else:
                        failure.append(f"create failed: {type(exc).__name__}: {exc}"[:400])
                    return
                with lock:
                    made.append(sbx)

            began = time.monotonic()
            try:
                with ThreadPoolExecutor(args.parallel) as pool:
                    list(pool.map(create_one, range(args.k)))
                created_s = time.monotonic() - began
                if failure:
                    print(f"the host could not hold K={args.k}: {failure[0]} "
                          f"after {len(made)} sandboxes ({created_s:.0f} s); as they stood:")
                else:
                    print(f"{len(made)} sandboxes created in {created_s:.0f} s "
                          f"({len(made) / created_s:.2f} creates/s with {args.parallel} "
                          "clients)")
                if refused:
                    print(f"admission stopped the creates at K={len(made)} of {args.k} "
                          f"(MemAvailable then {meminfo()['MemAvailable'] // 1024} MiB): "
                          f"{refused[0]}")
                if made:
                    failed = measure(args, made, tmp, before_used, before_busy,
                                     settled=not failure)
                if failure or (len(made) < args.k and not refused):
                    failed = 1
            finally:
                with ThreadPoolExecutor(args.parallel) as pool:
                    list(pool.map(lambda s: kill_quietly(client, s), made))
                print(f"killed {len(made)}")
            left_live = leftovers(tmp, tmp / "server" / "sandboxes",
                                  tmp / "server" / "pandastack.db", base, stopped=False)
        left_stopped = leftovers(tmp, tmp / "server" / "sandboxes", None, base, stopped=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print_leftovers(left_live, left_stopped)
    oom_after = oom_kills()
    print(f"OOM kills during the run: {oom_after - oom_before} (kernel count {oom_before} -> "
          f"{oom_after})")
    return 1 if failed or left_live or left_stopped or oom_after != oom_before else 0


def measure(args: argparse.Namespace, made: list[Sandbox], tmp: Path, before_used: float,
            before_busy: float, *, settled: bool) -> int:
    """Exec in each, then memory and the idle window (`settled`); else (creating failed)
    only the memory as it stands. 1 when a sandbox did not answer or its VMM is missing."""
    silent: list[str] = []
    if settled:
        def answers(sbx: Sandbox) -> str | None:
            try:
                result = sbx.exec(["echo", "ok"], timeout_seconds=120)
            except Exception as exc:
                return f"{sbx.id}: {type(exc).__name__}: {exc}"[:300]
            ok = result.exit_code == 0 and result.stdout.strip() == "ok"
            return None if ok else f"{sbx.id}: exit {result.exit_code}"

        with ThreadPoolExecutor(args.parallel) as pool:
            silent = [m for m in pool.map(answers, made) if m is not None]
        print(f"answered exec: {len(made) - len(silent)} of {len(made)}")
        for message in silent[:5]:
            print(f"  {message}")
    pids = vmm_pids_under(tmp)
    sizes = [smaps(p) for p in pids]
    pss = sum(s[0] for s in sizes) / 1024
    rss = sum(s[1] for s in sizes) / 1024
    with_used = used_mib()
    k = len(made)
    print(f"VMM processes: {len(pids)}")
    print(f"PSS per sandbox {pss / k:7.1f} MiB  (sum {pss:.0f} MiB; "
          f"RSS per sandbox {rss / k:.1f} MiB)")
    print(f"host memory used: before {before_used:.0f} MiB, with {k} running "
          f"{with_used:.0f} MiB, difference per sandbox "
          f"{(with_used - before_used) / k:.1f} MiB")
    if settled:
        busy, own = idle_window(args.idle_seconds, pids)
        print(f"host CPU busy over {args.idle_seconds:.0f} s with {k} idle: "
              f"{busy * 100:.1f}% of {os.cpu_count() or 1} cores (before the creates: "
              f"{before_busy * 100:.1f}%); the VMMs themselves: {own:.3f} cores "
              f"({own / k * 1000:.1f} millicores each)")
    print(f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 1 if silent or len(pids) != k else 0


def kill_quietly(client: Client, sbx: Sandbox) -> None:
    try:
        client.sandboxes.kill(sbx.id)
    except Exception as exc:  # reported, and the leftover check will name what stayed
        print(f"kill {sbx.id}: {type(exc).__name__}: {exc}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
