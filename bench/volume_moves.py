"""What portable volumes cost (ADR 0027, "Portable volumes"), on the host side, against a floor
measured in the same run: a volume of `--size-mb` holding a `--data-mb` file (written into
its ext4 with debugfs: no VM), two volume roots A and B sharing a private S3 server
(scripts/s3-server, loopback) under a fresh prefix.

- **floor**: the sparse local copy of the image (what a same-host copy, a fork's, costs);
- **snapshot**: `backup_volume` on A (copy aside, then the chunked upload); every round
  writes the file again with new bytes, so nothing is skipped as already stored;
- **restore**: a new volume of that snapshot on B (download and write);
- **move**: snapshot on A, restore on B under the same id, delete on A, delete the snapshot
  (what the control plane's move does, without its database writes).

Usage: python bench/volume_moves.py [--n 5] [--size-mb 1024] [--data-mb 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from common import line, pct
from objects import ROOT, start_s3
from pandastack.host.objects import ObjectStore, ObjectStoreConfig
from pandastack.host.runtime.remote import RemoteState
from pandastack.host.volumes.attach import HostVolumes
from pandastack.host.volumes.backup import VolumeBackups
from pandastack.host.volumes.store import VolumeStore, copy_image
from pandastack.rules import new_volume_backup_id, new_volume_id


def fill(image: Path, data_mb: int, scratch: Path) -> None:
    blob = scratch / "blob"
    with open(blob, "wb") as f:
        f.write(os.urandom(data_mb << 20))
    subprocess.run(["debugfs", "-w", "-R", "rm blob", str(image)], capture_output=True)
    subprocess.run(["debugfs", "-w", "-R", f"write {blob} blob", str(image)], check=True,
                   capture_output=True)
    blob.unlink()


async def run(n: int, size_mb: int, data_mb: int) -> None:
    with tempfile.TemporaryDirectory(prefix="pandastack-bench-vol-", dir="/tmp") as tmp_name:
        tmp = Path(tmp_name)
        tmp.chmod(0o755)  # the S3 server runs as the swift user
        s3_dir = tmp / "s3"
        env = start_s3(s3_dir)
        store = ObjectStore(ObjectStoreConfig.from_url(
            f"s3://{env['PANDASTACK_S3_BUCKET']}/bench-{uuid.uuid4().hex[:8]}", env),
            tmp / "cache")
        try:
            remote = RemoteState(store, tmp / "templates", disks=lambda: None,  # type: ignore
                                 driver_identity=lambda: "bench", progress=lambda m: None)
            a = HostVolumes(VolumeStore(tmp / "a"), lambda: [], progress=lambda m: None)
            b = HostVolumes(VolumeStore(tmp / "b"), lambda: [], progress=lambda m: None)
            on_a, on_b = VolumeBackups(a, remote), VolumeBackups(b, remote)
            floor: list[float] = []
            snap: list[float] = []
            restore: list[float] = []
            move: list[float] = []
            stored: list[float] = []
            for _ in range(n):
                vid = new_volume_id()
                await a.create(vid, size_mb)
                image = a.store.image(vid)
                await asyncio.to_thread(fill, image, data_mb, tmp)

                started = time.perf_counter()
                await asyncio.to_thread(copy_image, image, tmp / "floor.img")
                floor.append((time.perf_counter() - started) * 1000)
                (tmp / "floor.img").unlink()

                bid = new_volume_backup_id()
                started = time.perf_counter()
                made = await on_a.backup(vid, bid)
                snap.append((time.perf_counter() - started) * 1000)
                stored.append(made.stored_bytes / (1 << 20))

                copy = new_volume_id()
                started = time.perf_counter()
                await on_b.restore(bid, copy)
                restore.append((time.perf_counter() - started) * 1000)
                await b.delete(copy)
                await on_a.delete(bid)

                await asyncio.to_thread(fill, image, data_mb, tmp)  # new bytes: all sent
                started = time.perf_counter()
                moving = new_volume_backup_id()
                await on_a.backup(vid, moving)
                await on_b.restore(moving, vid)
                await a.delete(vid)
                await on_a.delete(moving)
                move.append((time.perf_counter() - started) * 1000)
                await b.delete(vid)
                await store.evict()
        finally:
            await store.close()
            subprocess.run([str(ROOT / "scripts" / "s3-server"), "stop", str(s3_dir)],
                           capture_output=True, timeout=120)
    base = pct(floor, 50)
    print(f"volume {size_mb} MiB holding {data_mb} MiB; stored per snapshot "
          f"p50 {pct(stored, 50):.0f} MiB")
    print(line("floor: local sparse copy", floor))
    for label, values in (("snapshot into the store", snap), ("restore on another root", restore),
                          ("move (snapshot, restore, deletes)", move)):
        print(line(label, values) + f"  ratio {pct(values, 50) / base:.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5)
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--data-mb", type=int, default=64)
    args = parser.parse_args()
    asyncio.run(run(args.n, args.size_mb, args.data_mb))


if __name__ == "__main__":
    main()
