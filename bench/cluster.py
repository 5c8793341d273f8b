"""Many hosts: what placing a sandbox costs an API server that keeps no state of its own.

- **placement**: a private PostgreSQL (scripts/pg-cluster) holds `--hosts` registered hosts
  (1,000 by default) with random capacity, usage, labels and templates, reported the way
  agents report them (`register_host`, then `heartbeat` with usage). A `ClusterPool` over
  that store decides where a sandbox goes, as a create does: `decision (cached hosts)` is
  the ranking over the hosts it last read (what a create pays while the hosts read is under
  `refresh_s` old); `decision + refresh` re-reads all hosts from the database first (what
  the first create after `refresh_s` pays). The floor is one round trip to the same database
  (`SELECT` of its clock), measured in the same run, interleaved.

Target (issue 17): placement decision with 1,000 hosts in the database <= 10 ms at p99.

Usage: python bench/cluster.py [--hosts 1000] [--n 200]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import line, pct

from pandastack.registry.queries import Usage
from pandastack.server.hosts.cluster import ClusterPool
from pandastack.server.hosts.placement import Shape
from pandastack.server.store import open_store

ROOT = Path(__file__).resolve().parents[1]
PG_CLUSTER = ROOT / "scripts" / "pg-cluster"
MAX_N = 10_000
MAX_HOSTS = 100_000
TEMPLATES = ("base", "python", "node", "team-a:3", "team-b:1")


class NoHost:
    """Placement never dials a host; this stands for the agents' ports."""

    async def close(self) -> None:
        return None


def fill(store: object, hosts: int, rng: random.Random) -> None:
    for i in range(hosts):
        vcpus = rng.choice((16, 32, 64))
        memory_mb = vcpus * 4096
        host = store.register_host(  # type: ignore[attr-defined]
            f"http://10.{i // 65536}.{(i // 256) % 256}.{i % 256}:7000", vcpus=vcpus,
            memory_mb=memory_mb, disk_mb=500_000,
            labels={"zone": rng.choice(("a", "b", "c"))}, version="bench")
        used = rng.randrange(vcpus)
        store.heartbeat(host.id, host.epoch, Usage(  # type: ignore[attr-defined]
            templates=tuple(rng.sample(TEMPLATES, 2)), sandboxes=used,
            used_vcpus=used, used_memory_mb=used * 512))


async def placement(dsn: str, hosts: int, n: int) -> None:
    store = open_store(dsn)
    rng = random.Random(17)
    started = time.monotonic()
    await asyncio.to_thread(fill, store, hosts, rng)
    print(f"registered {hosts} hosts in {time.monotonic() - started:.1f} s")
    pool = ClusterPool(store, lambda endpoint: NoHost(),  # type: ignore[arg-type,return-value]
                       stale_after_s=3600.0, refresh_s=3600.0)
    await pool.start()
    shape = Shape(vcpus=2, memory_mb=1024, template="python")
    floor: list[float] = []
    cached: list[float] = []
    fresh: list[float] = []
    for _ in range(3):  # warm-up: connections, statement caches
        store.db_time()
        pool._ranked(shape)
    for i in range(n):
        sides = [("floor", floor), ("cached", cached), ("fresh", fresh)]
        if i % 2:
            sides.reverse()
        for name, values in sides:
            t0 = time.perf_counter()
            if name == "floor":
                store.db_time()
            elif name == "cached":
                assert pool._ranked(shape)
            else:
                await pool.refresh(force=True)
                assert pool._ranked(shape)
            values.append((time.perf_counter() - t0) * 1000)
    await pool.close()
    store.close()
    base = pct(floor, 50)
    print(line("floor: one database round trip", floor))
    print(line("decision (cached hosts)", cached))
    print(line("decision + refresh (read all hosts)", fresh))
    print(f"ratio to the floor at p50: cached {pct(cached, 50) / base:.2f}, "
          f"with refresh {pct(fresh, 50) / base:.2f}")
    print(f"target p99 <= 10 ms: cached {pct(cached, 99):.2f} ms, "
          f"with refresh {pct(fresh, 99):.2f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--n", type=int, default=200)
    args = ap.parse_args()
    if not 1 <= args.n <= MAX_N or not 1 <= args.hosts <= MAX_HOSTS:
        ap.error(f"--n must be 1..{MAX_N}, --hosts 1..{MAX_HOSTS}")
    pg = Path(tempfile.mkdtemp(prefix="pandastack-bench-pg-", dir="/tmp"))  # stop removes it
    try:
        dsn = subprocess.run([str(PG_CLUSTER), "start", str(pg)], check=True, timeout=180,
                             capture_output=True, text=True).stdout.strip().splitlines()[-1]
        asyncio.run(placement(dsn, args.hosts, args.n))
    finally:
        subprocess.run([str(PG_CLUSTER), "stop", str(pg)], check=False, timeout=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
