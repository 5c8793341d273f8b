"""The bake's tick check in real VMs: a clone of a baked template idles tickless, and a bake
whose guest keeps a periodic tick is booted again, then refused instead of saved (its clones
would take HZ timer interrupts a second in idle, ADR 0038 addendum)."""

from __future__ import annotations

import functools
import shutil
import tempfile
from pathlib import Path

import pytest

from pandastack.host.runtime import HostRuntime
from pandastack.host.templates import builtin, tick
from pandastack.host.templates.builtin import TemplateStore
from tests.helpers import SandboxFactory

pytestmark = pytest.mark.vm


async def test_clone_of_a_template_idles_tickless(sandbox_factory: SandboxFactory) -> None:
    sbx = await sandbox_factory()
    result = await sbx.exec(tick.PROBE, timeout=60)
    assert result.exit_code == 0, result.stderr
    state = tick.parse_probe(result.stdout.decode())
    assert state.ok, state.describe()


async def test_clone_has_no_idle_polling_of_its_own(sandbox_factory: SandboxFactory) -> None:
    """The periodic kernel work GUEST_IDLE_ARGS turns off at bake stays off in every clone
    (an idle clone's VMM: 0.27 -> 0.07 % of a core, docs/benchmarks.md)."""
    sbx = await sandbox_factory()
    result = await sbx.exec(["cat", "/proc/sys/vm/compaction_proactiveness",
                             "/proc/sys/vm/stat_interval", "/proc/sys/kernel/watchdog"],
                            timeout=60)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.decode().split() == ["0", "60", "0"]


# `nohz=off highres=off` is what the watchdog's switch to refined-jiffies leaves, made certain:
# no oneshot mode, a tick each jiffy.
@pytest.mark.timeout(600)
async def test_bake_with_a_periodic_tick_is_refused(runtime: HostRuntime,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Two boots, not the default three: the second shows the retry, the third adds nothing.
    monkeypatch.setattr(builtin, "BAKE_ATTEMPTS", 2)
    # With nohz=off no read turns tickless: the check's reads are spaced by no pause here
    # (3 reads a boot still), not the 1 s each a clocksource change would need.
    monkeypatch.setattr(tick, "check", functools.partial(tick.check, pause_s=0.0))
    await runtime.prepare()
    # Beside the real templates, not under pytest's tmp_path: the VMM runs jailed as its own
    # user and must reach the bake's directory the way it reaches theirs.
    root = Path(tempfile.mkdtemp(prefix=".tick-test-", dir=runtime.config.home))
    try:
        store = TemplateStore(root, runtime.driver, runtime.image,
                              network=runtime.machinery.network,
                              kernel_args=" nohz=off highres=off")
        said: list[str] = []
        with pytest.raises(tick.PeriodicTick) as info:
            await store.ensure("base", progress=said.append)
        assert sum("booting again" in m for m in said) == 1, said  # booted twice, then gave up
        assert "not tickless in idle" in str(info.value)
        assert "cpu 0: nohz inactive, tick periodic" in str(info.value)
        assert [p.name for p in (root / "base").iterdir()] == [".lock"], \
            "a refused bake must leave no template behind"
    finally:
        shutil.rmtree(root, ignore_errors=True)
