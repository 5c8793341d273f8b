"""A sandbox's disk chain stays short: past MAX_LAYERS, its layers are merged into the top
while it runs (real VMs)."""

from __future__ import annotations

from typing import cast

import pytest

from pandastack.host.runtime import HostRuntime
from pandastack.host.runtime.disk_layers import MAX_LAYERS
from tests.helpers import SandboxFactory

pytestmark = pytest.mark.vm


def layers_of(runtime: HostRuntime, sandbox_id: str) -> list[str]:
    """The layer file names `describe` lists (its record's, copied)."""
    return cast(list[str], runtime.describe(sandbox_id)["layers"])


async def test_long_disk_chains_are_merged_and_nothing_is_lost(
        runtime: HostRuntime, sandbox_factory: SandboxFactory) -> None:
    sbx = await sandbox_factory()
    workdir = runtime.sandboxes_dir / sbx.id
    chain = runtime.driver.disks.layer_chain
    fresh_depth = len(chain(workdir / layers_of(runtime, sbx.id)[-1]))
    early = None
    for i in range(MAX_LAYERS):
        await sbx.write_file(f"/work/f{i}", f"data{i}".encode())
        snap = await runtime.snapshot(sbx.id)
        if i == 1:
            early = snap  # made from the long chain, kept across the merge
        else:
            runtime.delete_snapshot(snap.info.id)
    assert early is not None
    layers = layers_of(runtime, sbx.id)
    assert len(layers) == MAX_LAYERS + 1  # a merge has begun
    # The next snapshot ends the merge (it waits for it): the chain is the merged top and
    # the new one, and the merged layers' links are gone from the sandbox's directory.
    await sbx.write_file("/work/last", b"last")
    snap = await runtime.snapshot(sbx.id)
    try:
        after = layers_of(runtime, sbx.id)
        assert after == [layers[-1], after[-1]]
        assert sorted(p.name for p in workdir.glob("layer-*")) == sorted(after)
        assert len(chain(workdir / after[-1])) == fresh_depth + 1
        want = "".join(f"data{i}" for i in range(MAX_LAYERS)) + "last"
        files = " ".join(f"/work/f{i}" for i in range(MAX_LAYERS)) + " /work/last"
        assert (await sbx.exec(f"cat {files}")).stdout.decode() == want
        child = await sandbox_factory(snapshot=snap.info.id)
        assert (await child.exec(f"cat {files}")).stdout.decode() == want
        older = await sandbox_factory(snapshot=early.info.id)
        assert (await older.exec("cat /work/f0 /work/f1; test -e /work/f2")).stdout == \
            b"data0data1"
    finally:
        runtime.delete_snapshot(snap.info.id)
        runtime.delete_snapshot(early.info.id)


async def test_hibernation_ends_a_merge_under_way(
        runtime: HostRuntime, sandbox_factory: SandboxFactory) -> None:
    sbx = await sandbox_factory()
    for i in range(MAX_LAYERS):
        await sbx.write_file(f"/work/f{i}", b"x")
        runtime.delete_snapshot((await runtime.snapshot(sbx.id)).info.id)
    layers = layers_of(runtime, sbx.id)
    assert len(layers) == MAX_LAYERS + 1  # a merge has begun
    await runtime.hibernate(sbx.id)
    assert layers_of(runtime, sbx.id) == [layers[-1]]
    files = " ".join(f"/work/f{i}" for i in range(MAX_LAYERS))
    assert (await sbx.exec(f"cat {files}")).stdout == b"x" * MAX_LAYERS  # wakes it
