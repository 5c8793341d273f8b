"""Chaos (issue 22): SIGKILL the server in the middle of create, fork, snapshot, hibernate and
wake, and SIGKILL a sandbox's QEMU, each N times at a random moment, against a real
`pandastack serve` booting real VMs; after each blow the server is started again on the same
database and state dir and the invariant is checked:

- **every call ends**: the interrupted call returns a result or raises one of the SDK's
  errors (a dropped connection is `APIConnectionError`); none hangs past its bound and none is
  a 5xx other than the documented host errors;
- **no sandbox lost**: the sandbox the operation acted on (the source of a fork or snapshot,
  the one hibernated or woken) is still there after the restart, in a live state, and answers
  an exec once woken (its marker file intact); a sandbox whose QEMU was killed ends in a final
  state with a reason, or (persistent) comes back, and calls on it get a 4xx, never a 5xx;
- **no leftovers**: after every sandbox is killed and the server stopped, nothing of the run
  is on the host (the soak's checks: VMMs, namespaces, taps, claims, mounts, files, live rows).

Three more faults, without a server kill:

- **disk full during a snapshot** (`disk_snapshot`) and **during a template build**
  (`disk_build`): the snapshot store is a tmpfs of its own, filled before each blow to leave a
  random amount of room in [0, 1.5 x what one snapshot took]; the call must succeed or be a
  507 `insufficient_storage` (a build: fail with a reason), the sandbox keeps running, and
  once the room is back the next snapshot works;
- **the database read-only for a moment** (`db_readonly`): `chattr +i` on the SQLite file
  (and its WAL) for a random 0.5-3 s while a create -> exec -> kill cycle runs; every call ends
  with a result or a 503 `unavailable` ("the database is out of reach"), and afterwards no
  VM runs without a live row (the leftover checks).

The moment is drawn uniformly from [0, 1.5 x the operation's duration measured untimed first],
so some blows land before the server got the request and some after it answered.
Figures printed: per scenario, how many blows, how the interrupted calls ended, violations.
Exit status 1 on any violation or leftover.

Usage: python bench/chaos.py [--n 20] [--only create,fork,...] [--seed S]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.*

from tests.e2e.test_server_restart import ServeProcess
from tests.helpers import qemu_pids_under

from pandastack import Client, Sandbox
from pandastack.sdk import APIConnectionError, APIError, PandastackError, ServerError
from soak import Baseline, leftovers, print_leftovers

MAX_N = 200
CALL_BOUND_S = 300.0  # an interrupted call that has not ended by then has hung
# The disk faults first: what the kills leave in the snapshot store (snapshots and forks cut
# short, their files without a row until the server removes them past a grace) is printed
# after each scenario, and would be in the way of a store filled to a measured room.
SCENARIOS = ("disk_snapshot", "disk_build", "db_readonly", "create", "fork", "snapshot",
             "hibernate", "wake", "qemu")
STORE_MIB = 3072  # the snapshot store's tmpfs
# Each build's RUN differs (the blow's number and a random token), so no step is cached.
BUILD = "FROM base\nRUN echo {} > /root/built\n"
FINAL = {"killed", "failed", "expired", "reaped"}
MARK = "/root/chaos-mark"


@dataclass
class Tally:
    blows: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)


class Chaos:
    """One server (killed and started again), its client, and the checks."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.store = tmp / "snapshots"
        self.store.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={STORE_MIB}m,mode=0700",
                        "tmpfs", str(self.store)], check=True)
        self.env = {"PANDASTACK_SNAPSHOTS_DIR": str(self.store)}
        self.server = ServeProcess(tmp)
        self.server.start(timeout=300, extra_env=self.env)
        self.client = self._client()

    def _client(self) -> Client:
        return Client(self.server.url, self.server.api_key(), timeout=60)

    def restart(self) -> None:
        self.client.close()
        if self.server.proc is not None:
            self.server.signal(signal.SIGKILL)
        self.server.start(timeout=300, extra_env=self.env)
        self.client = self._client()

    def connect(self, sid: str) -> Sandbox:
        return self.client.sandboxes.connect(sid)

    def new(self, persistent: bool = False) -> Sandbox:
        sbx = self.client.sandboxes.create(template="base", ttl_seconds=900,
                                           persistent=persistent)
        sbx.files.write(MARK, sbx.id)
        return sbx

    def intact(self, sid: str, tally: Tally, what: str) -> None:
        """The sandbox `sid` is live, wakes if hibernated, and still holds its marker."""
        try:
            info = self.client.sandboxes.get(sid)
            if info.state in FINAL:
                tally.violations.append(f"{what}: {sid} lost ({info.state}: {info.end_reason})")
                return
            sbx = self.connect(sid)
            if info.state == "hibernated":
                sbx.wake()
            elif info.state == "paused":
                sbx.resume()
            got = sbx.files.read(MARK, format="text")
            if got != sid:
                tally.violations.append(f"{what}: {sid} marker reads {got!r}")
        except PandastackError as exc:
            tally.violations.append(f"{what}: {sid} unusable after restart: {exc!r}"[:300])

    def kill_all(self, tally: Tally, what: str) -> None:
        for info in self.client.sandboxes.list():
            try:
                self.client.sandboxes.kill(info.id)
            except PandastackError as exc:
                tally.violations.append(f"{what}: kill {info.id}: {exc!r}"[:300])

    def used(self) -> int:
        return shutil.disk_usage(self.store).used

    def fill(self, leave: int) -> Path:
        """Fill the snapshot store but `leave` bytes; the filler's path."""
        filler = self.store / "filler"
        filler.unlink(missing_ok=True)
        free = shutil.disk_usage(self.store).free
        with filler.open("wb") as f:
            os.posix_fallocate(f.fileno(), 0, max(1, free - leave))
        return filler

    def close(self) -> None:
        self.client.close()
        if self.server.proc is not None:
            self.server.signal(signal.SIGTERM)
        subprocess.run(["umount", "-l", str(self.store)], check=False)


def interrupted(call: Callable[[], object], delay: float, chaos: Chaos, tally: Tally,
                what: str) -> None:
    """Run `call` in a thread, SIGKILL the server after `delay`, restart it; tally how the
    call ended."""
    ended: list[str] = []

    def run() -> None:
        try:
            call()
            ended.append("result")
        except APIConnectionError:
            ended.append("connection error")
        except ServerError as exc:
            ended.append(f"5xx {exc.code}")
        except APIError as exc:
            ended.append(f"{exc.status} {exc.code}")
        except PandastackError as exc:
            ended.append(type(exc).__name__)
        except Exception as exc:  # anything else is a violation, named
            ended.append(f"unexpected {type(exc).__name__}: {exc}"[:200])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    time.sleep(delay)
    chaos.restart()
    thread.join(CALL_BOUND_S)
    tally.blows += 1
    outcome = ended[0] if ended else "hung"
    tally.outcomes[outcome] += 1
    if outcome == "hung" or outcome.startswith(("unexpected", "5xx")):
        tally.violations.append(f"{what}: the interrupted call ended as {outcome}")


def timed(call: Callable[[], object]) -> float:
    started = time.monotonic()
    call()
    return time.monotonic() - started


def scenario(name: str, chaos: Chaos, n: int, rng: random.Random) -> Tally:
    tally = Tally()
    source = chaos.new(persistent=name in ("hibernate", "wake"))
    sid = source.id
    if name == "create":
        span = timed(lambda: chaos.client.sandboxes.kill(chaos.new().id))
    elif name == "fork":
        def fork_and_kill() -> None:
            for child in source.fork():
                child.kill()

        span = timed(fork_and_kill)
    elif name == "snapshot":
        started = time.monotonic()
        try:
            source.snapshot()
        except APIError as exc:
            if exc.status != 507:
                raise
            # The store is full of what the earlier scenarios' blows cut off (removed past a
            # grace, docs/reliability.md): the blows below meet 507 too. A save that fails so
            # wrote until the store was full: its time stands in for the span.
            print(f"  snapshot: the store is full before the blows; a failed save took "
                  f"{time.monotonic() - started:.2f} s", flush=True)
        span = time.monotonic() - started
    elif name in ("hibernate", "wake"):
        span = timed(source.hibernate) + timed(source.wake)
        span /= 2
    else:
        span = 0.0
    if name in ("disk_snapshot", "disk_build", "db_readonly"):
        return fault_scenario(name, chaos, source, n, rng, tally)
    for i in range(n):
        what = f"{name} #{i + 1}"
        delay = rng.uniform(0, 1.5 * span)
        if name == "create":
            interrupted(lambda: chaos.new(), delay, chaos, tally, what)
        elif name == "fork":
            interrupted(lambda: chaos.connect(sid).fork(), delay, chaos, tally, what)
        elif name == "snapshot":
            interrupted(lambda: chaos.connect(sid).snapshot(), delay, chaos, tally, what)
        elif name == "hibernate":
            interrupted(lambda: chaos.connect(sid).hibernate(), delay, chaos, tally, what)
        elif name == "wake":
            chaos.connect(sid).hibernate()
            interrupted(lambda: chaos.connect(sid).wake(), delay, chaos, tally, what)
        else:
            qemu_blow(chaos, tally, what, rng.random() < 0.5)
            continue
        chaos.intact(sid, tally, what)
        # what the interrupted call made (a child, a half-made create) goes, the source stays
        for info in chaos.client.sandboxes.list():
            if info.id != sid:
                chaos.client.sandboxes.kill(info.id)
    chaos.kill_all(tally, name)
    for snap in chaos.client.snapshots.list():
        chaos.client.snapshots.delete(snap.id)
    return tally


def fault_scenario(name: str, chaos: Chaos, source: Sandbox, n: int, rng: random.Random,
                   tally: Tally) -> Tally:
    """The faults that need no server kill (the module docstring)."""
    sid = source.id
    before = chaos.used()
    room = 0
    if name == "disk_snapshot":
        snap = source.snapshot()
        # a snapshot may reserve its worst case (the guest's RAM) before it writes
        room = max(chaos.used() - before, source.refresh().memory_mb << 20)
        chaos.client.snapshots.delete(snap)
    elif name == "disk_build":
        chaos.client.templates.build(BUILD.format("first"), "chaos-build")
        room = max(chaos.used() - before, 1 << 20)
    if name != "db_readonly":
        print(f"  {name}: one took {room >> 20} MiB of the store", flush=True)
    for i in range(n):
        what = f"{name} #{i + 1}"
        tally.blows += 1
        if name == "db_readonly":
            db_blow(chaos, tally, what, rng, sid)
            continue
        filler = chaos.fill(int(rng.uniform(0, 1.5 * room)))
        try:
            if name == "disk_snapshot":
                snap = chaos.connect(sid).snapshot()
                tally.outcomes["result"] += 1
                chaos.client.snapshots.delete(snap)
            else:
                chaos.client.templates.build(BUILD.format(f"{i}-{rng.random()}"),
                                             "chaos-build")
                tally.outcomes["result"] += 1
        except ServerError as exc:
            if exc.status == 507:
                tally.outcomes["507 insufficient_storage"] += 1
            else:
                tally.outcomes[f"5xx {exc.code}"] += 1
                tally.violations.append(f"{what}: {exc}"[:300])
        except PandastackError as exc:  # a build that failed says why
            tally.outcomes[type(exc).__name__] += 1
            if "space" not in str(exc).lower() and "ENOSPC" not in str(exc):
                tally.violations.append(f"{what}: failed without naming the disk: {exc}"[:300])
        finally:
            filler.unlink(missing_ok=True)
        chaos.intact(sid, tally, what)
    if name == "disk_snapshot":  # with the room back, a snapshot works
        try:
            chaos.client.snapshots.delete(chaos.connect(sid).snapshot())
        except PandastackError as exc:
            tally.violations.append(f"{name}: no snapshot once the disk has room: {exc}"[:300])
    chaos.kill_all(tally, name)
    for left in chaos.client.snapshots.list():
        chaos.client.snapshots.delete(left.id)
    return tally


def db_blow(chaos: Chaos, tally: Tally, what: str, rng: random.Random,
            keep: str) -> None:
    """A create -> exec -> kill cycle with the database file immutable for a moment."""
    db = chaos.tmp / "pandastack.db"
    # never the -shm file: SQLite maps it, and a write fault on an immutable mapping is a
    # SIGBUS that kills the process (a fault of this bench's making, not of the database's)
    files = [str(f) for f in (db, db.with_name(db.name + "-wal"),
                              db.with_name(db.name + "-journal")) if f.exists()]
    ended: list[str] = []

    def cycle() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                sbx = chaos.new()
                sbx.exec("true")
                sbx.kill()
                ended.append("result")
                return
            except ServerError as exc:
                if exc.code != "unavailable":
                    ended.append(f"5xx {exc.code}: {exc.message}"[:200])
                    return
                tally.outcomes["503 unavailable (then retried)"] += 1
                time.sleep(0.5)
            except PandastackError as exc:
                ended.append(f"{type(exc).__name__}: {exc}"[:200])
                return
        ended.append("hung")

    thread = threading.Thread(target=cycle, daemon=True)
    thread.start()
    time.sleep(rng.uniform(0, 2.0))
    subprocess.run(["chattr", "+i", *files], check=True)
    try:
        time.sleep(rng.uniform(0.5, 3.0))
    finally:
        subprocess.run(["chattr", "-i", *files], check=True)
    thread.join(CALL_BOUND_S)
    outcome = ended[0] if ended else "hung"
    tally.outcomes[outcome if outcome == "result" else outcome.split(":")[0]] += 1
    if outcome != "result":
        tally.violations.append(f"{what}: the cycle ended as {outcome}")
    for info in chaos.client.sandboxes.list():  # what a refused kill left, if any
        if info.id != keep:
            chaos.client.sandboxes.kill(info.id)


def qemu_blow(chaos: Chaos, tally: Tally, what: str, persistent: bool) -> None:
    """SIGKILL the QEMU of a fresh sandbox: it must end (or, persistent, come back) with a
    reason, and calls on it must get an answer that is not a 5xx."""
    sbx = chaos.new(persistent=persistent)
    pids = qemu_pids_under(chaos.server.state_dir / sbx.id)
    tally.blows += 1
    if len(pids) != 1:
        tally.violations.append(f"{what}: {len(pids)} QEMU processes for {sbx.id}")
        return
    os.kill(pids[0], signal.SIGKILL)
    deadline = time.monotonic() + 60
    state: str = "?"
    seen: set[str] = set()
    while time.monotonic() < deadline:
        state = str(chaos.client.sandboxes.get(sbx.id).state)
        if state in FINAL or state == "stopped":
            break
        try:
            sbx.exec("true", timeout_seconds=10)
        except ServerError as exc:
            seen.add(f"5xx {exc.code}: {exc.message}"[:160])
        except APIError as exc:
            seen.add(f"{exc.status} {exc.code}")
        except PandastackError as exc:
            seen.add(type(exc).__name__)
        time.sleep(0.5)
    for answer in sorted(seen):
        tally.outcomes[f"exec meanwhile: {answer}"] += 1
        if answer.startswith("5xx"):
            tally.violations.append(f"{what}: exec after the QEMU kill: {answer}")
    tally.outcomes[f"{'persistent' if persistent else 'ephemeral'} -> {state}"] += 1
    if state not in FINAL and state != "stopped":
        tally.violations.append(f"{what}: still {state} 60 s after its QEMU was killed")
    with_reason = chaos.client.sandboxes.get(sbx.id)
    if with_reason.state in FINAL and not with_reason.end_reason:
        tally.violations.append(f"{what}: ended {with_reason.state} with no end_reason")
    try:
        chaos.client.sandboxes.kill(sbx.id)
    except ServerError as exc:
        tally.violations.append(f"{what}: kill after the QEMU kill: 5xx {exc.code}")
    except PandastackError:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=20, help=f"blows per scenario, <= {MAX_N}")
    parser.add_argument("--only", default=",".join(SCENARIOS))
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    chosen = [s for s in args.only.split(",") if s]
    if not 1 <= args.n <= MAX_N or any(s not in SCENARIOS for s in chosen):
        parser.error(f"--n in 1..{MAX_N}; --only from {','.join(SCENARIOS)}")
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    base = Baseline.now()
    tmp = Path(tempfile.mkdtemp(prefix="psc-", dir="/tmp"))
    tallies: dict[str, Tally] = {}
    left_live: list[str] = []
    left_stopped: list[str] = []
    print(f"seed {seed}; state under {tmp}")
    try:
        chaos = Chaos(tmp)
        try:
            for name in chosen:
                began = time.monotonic()
                tallies[name] = scenario(name, chaos, args.n, rng)
                print(f"  {name}: {tallies[name].blows} blows in "
                      f"{time.monotonic() - began:.0f} s; snapshot store holds "
                      f"{chaos.used() >> 20} MiB", flush=True)
            db = tmp / "pandastack.db"
            left_live = [item for item in leftovers(tmp, chaos.server.state_dir, db, base,
                                                    stopped=False)
                         if item != f"mount {chaos.store}"]  # this bench's own store
        finally:
            chaos.close()
        left_stopped = leftovers(tmp, chaos.server.state_dir, None, base, stopped=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    bad = 0
    for name, tally in tallies.items():
        ends = ", ".join(f"{k} x{v}" for k, v in sorted(tally.outcomes.items()))
        print(f"{name}: {tally.blows} blows; calls ended: {ends}; "
              f"violations {len(tally.violations)}")
        for v in tally.violations[:5]:
            print(f"  {v}")
        bad += len(tally.violations)
    print_leftovers(left_live, left_stopped)
    return 1 if bad or left_live or left_stopped else 0


if __name__ == "__main__":
    sys.exit(main())
