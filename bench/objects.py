"""Snapshots through the object store (ADR 0016, 0020): what publishing and fetching cost,
with files stored as 4 MiB chunks (holes never sent, chunks the store has never sent again).

A private S3 server (scripts/s3-server: Swift's s3api on loopback) and a fresh prefix; three
runtimes on this machine: A and B share the store, N has none.

- **first publish**: a snapshot on A while the store holds nothing (the template's disk,
  rootfs, kernel and initrd go too), then a second and a third snapshot (the template is in
  the store): time of `snapshot()` (it returns once published) and what was sent;
- **no store**: snapshots on N, the floor;
- **first fetch**: a create on B from A's first snapshot (template too) and from the third
  (template already fetched), to the first exec answered, and what was fetched;
- **cached vs same host**: creates on B from the snapshot it now holds against creates on A
  from its own snapshot, interleaved, to the first exec answered.

Usage: python bench/objects.py [--n 8]
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import asdict
from pathlib import Path

from common import line, temp_runtime
from pandastack.host.objects import ObjectStoreConfig
from pandastack.host.runtime import HostRuntime

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20


def start_s3(directory: Path) -> dict[str, str]:
    started = subprocess.run([str(ROOT / "scripts" / "s3-server"), "start", str(directory)],
                             capture_output=True, text=True, timeout=300, check=True)
    env = {}
    for text in started.stdout.splitlines():
        if text.startswith("export "):
            name, _, value = text.removeprefix("export ").partition("=")
            env[name] = shlex.split(value)[0] if value else ""
    return env


def sent(rt: HostRuntime) -> dict[str, int]:
    assert rt.remote is not None
    return dict(asdict(rt.remote.store.stats))


def delta(after: dict[str, int], before: dict[str, int]) -> str:
    d = {k: after[k] - before[k] for k in after}
    return (f"sent {d['chunk_uploads']} chunks ({d['chunk_bytes_uploaded'] / MiB:.0f} MiB), "
            f"{d['chunks_known'] + d['chunks_present']} not sent (the store had them), "
            f"{d['holes']} holes; fetched {d['downloads']} chunks")


async def create_ready(rt: HostRuntime, snapshot: str) -> tuple[float, str]:
    t = time.perf_counter()
    sbx = await rt.create(snapshot=snapshot)
    result = await sbx.exec("true")
    elapsed = (time.perf_counter() - t) * 1000
    assert result.exit_code == 0
    return elapsed, sbx.id


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=8)
    args = parser.parse_args()
    s3_dir = Path(tempfile.mkdtemp(prefix="psob-s3-", dir="/tmp"))
    caches = Path(tempfile.mkdtemp(prefix="psob-c-", dir="/tmp"))
    try:
        env = start_s3(s3_dir)
        store = ObjectStoreConfig.from_url(
            f"s3://{env['PANDASTACK_S3_BUCKET']}/bench-{uuid.uuid4().hex[:8]}", env)
        async with temp_runtime("psob-a-", object_store=store,
                                objects_cache=caches / "a" / "objects-cache") as (a, _), \
                temp_runtime("psob-b-", object_store=store,
                             objects_cache=caches / "b" / "objects-cache") as (b, _), \
                temp_runtime("psob-n-") as (n, _):
            await run(a, b, n, args.n)
    finally:
        subprocess.run([str(ROOT / "scripts" / "s3-server"), "stop", str(s3_dir)],
                       capture_output=True, timeout=60)
        shutil.rmtree(s3_dir, ignore_errors=True)
        shutil.rmtree(caches, ignore_errors=True)


async def run(a: HostRuntime, b: HostRuntime, n: HostRuntime, rounds: int) -> None:
    sbx = await a.create()
    await sbx.write_file("/work/note", b"first")
    before = sent(a)
    t = time.perf_counter()
    first = (await a.snapshot(sbx.id, "first")).info
    print(f"{'snapshot + publish, empty store':40s} {time.perf_counter() - t:8.2f} s   "
          f"{delta(sent(a), before)}")

    publish: list[float] = []
    later = []
    for i in range(max(2, rounds // 2)):
        await sbx.write_file("/work/note", f"round {i}".encode())
        before = sent(a)
        t = time.perf_counter()
        later.append((await a.snapshot(sbx.id, f"later-{i}")).info)
        publish.append((time.perf_counter() - t) * 1000)
        print(f"  snapshot {i + 2}: {publish[-1]:.0f} ms, {delta(sent(a), before)}")
    other = await a.create()
    before = sent(a)
    t = time.perf_counter()
    fresh = (await a.snapshot(other.id, "other-sandbox")).info
    print(f"{'snapshot + publish, other sandbox':40s} {time.perf_counter() - t:8.2f} s   "
          f"{delta(sent(a), before)}")
    print(line("snapshot + publish, template in store", publish))

    plain: list[float] = []
    local = await n.create()
    for i in range(max(2, rounds // 2)):
        t = time.perf_counter()
        await n.snapshot(local.id, f"plain-{i}")
        plain.append((time.perf_counter() - t) * 1000)
    print(line("snapshot, no object store", plain))

    before = sent(b)
    ms, _ = await create_ready(b, first.id)
    print(f"{'cross-host create, first (template too)':40s} {ms / 1000:8.2f} s   "
          f"{delta(sent(b), before)}")
    firsts = []
    for info in (fresh, *later):
        before = sent(b)
        ms, _ = await create_ready(b, info.id)
        firsts.append(ms)
        print(f"  first create of {info.name}: {ms:.0f} ms, {delta(sent(b), before)}")
    print(line("cross-host create, first, template here", firsts))

    cached: list[float] = []
    same: list[float] = []
    for _ in range(rounds):
        for rt, into in ((b, cached), (a, same)):
            ms, sid = await create_ready(rt, first.id)
            into.append(ms)
            await rt.kill(sid)
    print(line("cross-host create, cached", cached))
    print(line("same-host create from snapshot", same))


if __name__ == "__main__":
    asyncio.run(main())
