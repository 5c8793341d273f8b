"""The QEMU driver on real VMs, through the runtime (`runtime` fixture, tests/conftest.py)."""

from __future__ import annotations

import os

import pytest

from pandastack.host.runtime import HostRuntime
from pandastack.host.vmm.host_memory import reports_free_pages
from pandastack.host.vmm.qemu import QemuDriver
from tests.helpers import SandboxFactory

pytestmark = pytest.mark.vm


def _thp_enabled(pid: int) -> str:
    with open(f"/proc/{pid}/status") as status:
        return next(line.split()[1] for line in status if line.startswith("THP_enabled:"))


async def test_template_clones_run_without_huge_pages_snapshot_restores_as_configured(
        runtime: HostRuntime, sandbox_factory: SandboxFactory) -> None:
    """A template clone's VMM starts with transparent huge pages off (its translated code then
    costs memory 4 KiB at a time, not 2 MiB); a restore from a stream keeps them where the
    driver says so (its anonymous RAM loads faster so, unless fresh memory is slow to touch in
    2 MiB pages). The starting host process keeps its own setting."""
    own = _thp_enabled(os.getpid())
    clone = await sandbox_factory()
    assert clone.pid is not None and _thp_enabled(clone.pid) == "0"
    snap = await runtime.snapshot(clone.id)
    try:
        restored = await sandbox_factory(snapshot=snap.info.id)
        driver = runtime.driver
        assert isinstance(driver, QemuDriver)
        if runtime.config.stream_huge_pages == "auto":
            assert driver.stream_huge_pages is not reports_free_pages()
        wanted = own if driver.stream_huge_pages else "0"
        assert restored.pid is not None and _thp_enabled(restored.pid) == wanted
        assert _thp_enabled(os.getpid()) == own
    finally:
        runtime.delete_snapshot(snap.info.id)
    assert _thp_enabled(os.getpid()) == own
