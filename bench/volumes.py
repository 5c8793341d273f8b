"""What volumes cost (ADR 0027), each against a floor measured in the same run, interleaved so
that drift hits both alike:

- create + first exec with one volume mounted read-write, against the same without one
  (the floor): the mount's share of a create (the size announcement and mount(2) in the guest);
- the same with the volume read-only (a reader's overlay is made too);
- create + first exec from a template baked with no volume slots (a second runtime with
  `volume_slots=0`), against the product's four empty slots: what the slots cost every
  create, volumes or not;
- a fork of a sandbox holding `--data-mb` of written data on a read-write volume, against a
  fork of one without a volume: the copy made while the parent is stopped.

Usage: python bench/volumes.py [--n 30] [--size-mb 1024] [--data-mb 64] [--forks 10]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from common import line, pct, temp_runtime
from pandastack.host.runtime import HostRuntime
from pandastack.hostport.volumes import VolumeMountRequest
from pandastack.rules import new_volume_id


async def create_once(rt: HostRuntime, volumes: list[VolumeMountRequest]) -> float:
    started = time.perf_counter()
    sbx = await rt.create("base", volumes=volumes)
    result = await sbx.exec(["true"])
    elapsed = time.perf_counter() - started
    assert result.exit_code == 0, result
    await rt.kill(sbx.id)
    return elapsed * 1000




async def fork_once(rt: HostRuntime, volumes: list[VolumeMountRequest],
                    data_mb: int) -> tuple[float, float]:
    parent = await rt.create("base", volumes=volumes)
    target = "/data/blob" if volumes else "/root/blob"
    fill = await parent.exec(["sh", "-c", f"head -c {data_mb}M /dev/urandom > {target}; sync"],
                             timeout=300)
    assert fill.exit_code == 0, fill
    started = time.perf_counter()
    children = await rt.fork(parent.id, 1)
    elapsed = (time.perf_counter() - started) * 1000
    check = await children[0].exec(["sh", "-c", f"test -s {target}"])
    assert check.exit_code == 0, check
    for sbx in (*children, parent):
        await rt.kill(sbx.id)
    for volume in await rt.volumes.all():
        if volume.source is not None:
            await rt.volumes.delete(volume.id)
    return elapsed, 0.0


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--data-mb", type=int, default=64)
    parser.add_argument("--forks", type=int, default=10)
    args = parser.parse_args()
    async with temp_runtime("psv-") as (rt, _scratch), \
            temp_runtime("psw-", volume_slots=0) as (bare_rt, _):
        await rt.ensure_template("base")
        volume_id = new_volume_id()
        await rt.volumes.create(volume_id, args.size_mb)
        rw = [VolumeMountRequest(volume_id, "/data")]
        ro = [VolumeMountRequest(volume_id, "/data", read_only=True)]
        # A sandbox of each runtime stays up meanwhile: a bake prunes the versions of `base`
        # that no VMM uses, and the two runtimes' templates are two versions of it.
        await rt.create("base")
        await bare_rt.create("base")  # bakes the slot-less template once
        for warm in ([], rw, ro):
            await create_once(rt, warm)
        floor: list[float] = []
        mounted: list[float] = []
        reader: list[float] = []
        bare: list[float] = []
        slotted: list[float] = []
        for _ in range(args.n):
            floor.append(await create_once(rt, []))
            mounted.append(await create_once(rt, rw))
            reader.append(await create_once(rt, ro))
            bare.append(await create_once(bare_rt, []))
            slotted.append(await create_once(rt, []))
        f50 = pct(floor, 50)
        print(line("create + exec, no volume (floor)", floor))
        print(line("create + exec, 1 volume read-write", mounted))
        print(line("create + exec, 1 volume read-only", reader))
        print(f"  read-write: p50 {pct(mounted, 50) - f50:+.1f} ms over the floor "
              f"(ratio {pct(mounted, 50) / f50:.2f}); read-only: p50 "
              f"{pct(reader, 50) - f50:+.1f} ms (ratio {pct(reader, 50) / f50:.2f})")
        print(line("create + exec, template with 0 slots", bare))
        print(line(f"create + exec, template with {rt.driver.volume_slots} slots", slotted))
        print(f"  the slots: p50 {pct(slotted, 50) - pct(bare, 50):+.1f} ms "
              f"(ratio {pct(slotted, 50) / pct(bare, 50):.2f})")
        plain: list[float] = []
        copied: list[float] = []
        for _ in range(args.forks):
            plain.append((await fork_once(rt, [], args.data_mb))[0])
            copied.append((await fork_once(rt, rw, args.data_mb))[0])
        print(line("fork, no volume (floor)", plain))
        print(line(f"fork, volume with {args.data_mb} MiB written", copied))
        print(f"  the copy: p50 {pct(copied, 50) - pct(plain, 50):+.1f} ms")
        await rt.volumes.delete(volume_id)


if __name__ == "__main__":
    asyncio.run(main())
