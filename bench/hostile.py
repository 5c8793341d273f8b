"""Hostile tenants (issue 22): while one sandbox attacks, does a neighbour keep its pace?

A live server (`api.live_server`: `pandastack serve`, host in-process, everything private under
a temporary directory) runs a neighbour sandbox and, one attack at a time, a fresh attacker
sandbox. The neighbour's exec (`true`, through the SDK) is timed `--n` times while idle before
the attacks, and again while each attack runs; the figure is the ratio of the two p50s
(issue 22's bound: within 2x). After each attack the attacker must be usable (it answers
`echo ok`) or cleanly ended with a reason, and the server must answer /health.

Attacks (each bounded by `--seconds` inside the guest):

- fork bomb: `:(){ :|:& };:` under bash;
- memory hog: python3 appending 32 MiB strings until the guest's limit kills it;
- output flood: `yes` through one exec (kept output is bounded; the rest counted as dropped);
- disk fill: `dd` of zeros until the guest's disk is full;
- console flood: lines written to /dev/console as fast as the guest can;
- garbage agent: the guest agent killed and bytes that are not frames written to its port;
- 10k tiny files: created in one directory, then listed through the API;
- a 5 GB file: a sparse file of 5 GiB read through the API as a stream (the first 256 MiB);
- stdin never read: a process that never reads its stdin sent 32 MiB of it.

Figures printed: idle p50/p99, then per attack the neighbour's p50/p99 during it, the ratio to
idle, what became of the attacker. Exit status 1 when a ratio passes 2x, the neighbour fails an
exec, or the server stops answering.

Usage: python bench/hostile.py [--n 20] [--seconds 20] [--only fork_bomb,...]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from api import live_server
from common import line, pct
from pandastack import Client, Sandbox
from pandastack.sdk import PandastackError

MAX_N = 500
MAX_SECONDS = 300
BOUND = 2.0  # neighbour p50 during an attack / idle p50
STREAM_READ = 256 << 20
STDIN_BYTES = 32 << 20

Attack = Callable[[Sandbox, int], str]


def fork_bomb(sbx: Sandbox, seconds: int) -> str:
    r = sbx.exec("bash -c ':(){ :|:& };:'; sleep 600", timeout_seconds=seconds)
    return f"timed_out={r.timed_out}"


def memory_hog(sbx: Sandbox, seconds: int) -> str:
    r = sbx.exec(["python3", "-c", "h = []\nwhile True: h.append(b'x' * (32 << 20))"],
                 timeout_seconds=seconds)
    return f"exit={r.exit_code} signal={r.signal}"


def output_flood(sbx: Sandbox, seconds: int) -> str:
    r = sbx.exec("yes flood", timeout_seconds=seconds)
    return f"kept {len(r.stdout)} chars, truncated={r.truncated}"


def disk_fill(sbx: Sandbox, seconds: int) -> str:
    r = sbx.exec("dd if=/dev/zero of=/root/fill bs=1M", timeout_seconds=seconds)
    df = sbx.exec("df -m / | tail -1; ls -s --block-size=M /root/fill", timeout_seconds=60)
    return (f"exit={r.exit_code} signal={r.signal} timed_out={r.timed_out} "
            f"stderr={r.stderr.strip()[-80:]!r}; then: {' '.join(df.stdout.split())}")


def console_flood(sbx: Sandbox, seconds: int) -> str:
    r = sbx.exec("while :; do echo console flood; done > /dev/console",
                 timeout_seconds=seconds)
    return f"timed_out={r.timed_out}"


GARBAGE = textwrap.dedent("""
    for d in /sys/class/virtio-ports/*; do
      [ "$(cat $d/name)" = org.pandastack.agent ] && port=/dev/$(basename $d)
    done
    sleep 0.5
    pkill -9 -f 'pandastack-agen[t] --guest|python3 -m pandastack_gues[t]'
    head -c 1000000 /dev/urandom > $port
    printf 'PS\\001\\000\\377\\377\\377\\377\\377\\377\\377\\377' > $port
""")


def garbage_agent(sbx: Sandbox, seconds: int) -> str:
    sbx.commands.start(["setsid", "sh", "-c", GARBAGE])
    deadline = time.monotonic() + seconds
    answers = 0
    while time.monotonic() < deadline:
        try:
            sbx.exec("true", timeout_seconds=10)
            answers += 1
        except PandastackError:
            pass
        time.sleep(0.5)
    return f"{answers} execs answered during it"


def tiny_files(sbx: Sandbox, seconds: int) -> str:
    sbx.exec("mkdir -p /root/t && cd /root/t && seq 10000 | xargs touch",
             timeout_seconds=seconds)
    return f"listed {len(sbx.files.list('/root/t'))} entries"


def big_file(sbx: Sandbox, seconds: int) -> str:
    sbx.exec("truncate -s 5G /root/big", timeout_seconds=seconds)
    got = 0
    deadline = time.monotonic() + seconds
    for chunk in sbx.files.read("/root/big", format="stream"):
        got += len(chunk)
        if got >= STREAM_READ or time.monotonic() > deadline:
            break
    return f"read {got >> 20} MiB of 5 GiB"


def stdin_never_read(sbx: Sandbox, seconds: int) -> str:
    handle = sbx.commands.start(["sleep", str(seconds)])
    sent = 0
    chunk = b"x" * (1 << 20)
    deadline = time.monotonic() + seconds
    try:
        while sent < STDIN_BYTES and time.monotonic() < deadline:
            handle.send_stdin(chunk)
            sent += len(chunk)
        outcome = "all accepted"
    except PandastackError as exc:
        outcome = f"refused: {type(exc).__name__} {getattr(exc, 'code', '')}"
    handle.kill()
    return f"sent {sent >> 20} MiB, {outcome}"


ATTACKS: dict[str, Attack] = {
    "fork_bomb": fork_bomb, "memory_hog": memory_hog, "output_flood": output_flood,
    "disk_fill": disk_fill, "console_flood": console_flood, "garbage_agent": garbage_agent,
    "tiny_files": tiny_files, "big_file": big_file, "stdin_never_read": stdin_never_read,
}


def neighbour_times(sbx: Sandbox, n: int, stop: threading.Event | None = None) -> list[float]:
    """n timed execs of `true` (fewer if `stop` is set first, at least one)."""
    times: list[float] = []
    for _ in range(n):
        started = time.perf_counter()
        r = sbx.exec("true", timeout_seconds=60)
        if r.exit_code != 0:
            raise RuntimeError(f"neighbour exec exit {r.exit_code}")
        times.append(time.perf_counter() - started)
        if stop is not None and stop.is_set():
            break
    return times


def attacker_fate(client: Client, sid: str) -> str:
    info = client.sandboxes.get(sid)
    if info.state in ("killed", "failed", "expired", "reaped", "stopped"):
        return f"ended {info.state}: {info.end_reason}"
    try:
        r = client.sandboxes.connect(sid).exec("echo ok", timeout_seconds=60)
        return "usable" if r.stdout == "ok\n" else f"answers {r.stdout!r}"
    except PandastackError as exc:
        return f"NOT usable: {exc}"[:200]


def one_attack(client: Client, api_url: str, neighbour: Sandbox, name: str,
               idle: list[float], n: int, seconds: int) -> list[str]:
    """Run one attack in a fresh sandbox while timing the neighbour; the violations seen."""
    bad: list[str] = []
    attacker = client.sandboxes.create(template="base", ttl_seconds=900)
    stop = threading.Event()
    said: list[str] = []

    def attack() -> None:
        try:
            said.append(ATTACKS[name](attacker, seconds))
        except Exception as exc:  # the attack's own fate is a figure too
            said.append(f"raised {type(exc).__name__}: {exc}"[:200])
        finally:
            stop.set()

    thread = threading.Thread(target=attack, daemon=True)
    thread.start()
    time.sleep(min(2.0, seconds / 4))  # let it get going
    try:
        during = neighbour_times(neighbour, n, stop)
    except Exception as exc:
        bad.append(f"{name}: the neighbour failed: {exc}")
        during = []
    thread.join(seconds * 3 + 120)
    health = httpx.get(f"{api_url}/health", timeout=30).status_code
    fate = attacker_fate(client, attacker.id)
    ratio = pct(during, 50) / pct(idle, 50) if during else float("inf")
    print(line(f"neighbour exec, during {name}", during or [0.0], "s")
          + f"  x{ratio:.2f} of idle")
    print(f"  attack: {said[0] if said else 'still running'}; attacker: {fate}; "
          f"server /health {health}", flush=True)
    if ratio > BOUND:
        bad.append(f"{name}: neighbour p50 x{ratio:.2f} of idle (bound x{BOUND})")
    if health != 200 or fate.startswith("NOT"):
        bad.append(f"{name}: server {health}, attacker {fate}")
    with contextlib.suppress(PandastackError):
        client.sandboxes.kill(attacker.id)
    return bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=20, help=f"neighbour execs, <= {MAX_N}")
    parser.add_argument("--seconds", type=int, default=20, help=f"per attack, <= {MAX_SECONDS}")
    parser.add_argument("--only", default=",".join(ATTACKS))
    args = parser.parse_args()
    chosen = [a for a in args.only.split(",") if a]
    if not 1 <= args.n <= MAX_N or not 1 <= args.seconds <= MAX_SECONDS \
            or any(a not in ATTACKS for a in chosen):
        parser.error(f"--n 1..{MAX_N}, --seconds 1..{MAX_SECONDS}, --only from "
                     f"{','.join(ATTACKS)}")
    tmp = Path(tempfile.mkdtemp(prefix="psh-", dir="/tmp"))
    bad: list[str] = []
    try:
        with live_server(tmp) as server, Client(server.api_url, server.api_key,
                                                timeout=120) as client:
            neighbour = client.sandboxes.create(template="base", ttl_seconds=3600)
            neighbour_times(neighbour, 3)  # warm
            idle = neighbour_times(neighbour, args.n)
            print(line("neighbour exec, idle", idle, "s"))
            for name in chosen:
                bad += one_attack(client, server.api_url, neighbour, name, idle, args.n,
                                  args.seconds)
            neighbour.kill()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"violations: {len(bad)}")
    for item in bad:
        print(f"  {item}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
