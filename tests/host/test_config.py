"""HostConfig: environment parsing and what follows from it (pure logic)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pandastack.host.config import AUTO_STREAM_HUGETLB_MB, GUEST_IDLE_ARGS, TCG_ARGS, HostConfig


@pytest.mark.parametrize(("setting", "accel", "args"), [
    ("auto", "tcg", " norandmaps tsc=reliable"), ("auto", "kvm", ""),
    ("on", "tcg", " tsc=reliable"), ("on", "kvm", ""),
    ("off", "tcg", " norandmaps tsc=reliable"), ("off", "kvm", " norandmaps"),
])
def test_guest_aslr_and_accel_give_the_kernel_args(setting: str, accel: str, args: str) -> None:
    tcg_only = TCG_ARGS if accel == "tcg" else ""
    want = args + GUEST_IDLE_ARGS + tcg_only
    assert HostConfig(guest_aslr=setting).guest_kernel_args(accel) == want


def test_speculation_defences_are_off_only_under_tcg() -> None:
    # Under KVM the guest's code runs on the host CPU: its kernel keeps its defences.
    assert "mitigations=off" in HostConfig().guest_kernel_args("tcg")
    assert "mitigations" not in HostConfig().guest_kernel_args("kvm")


def test_guest_aslr_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PANDASTACK_GUEST_ASLR", "on")
    assert HostConfig.from_env().guest_aslr == "on"


def test_a_bad_guest_aslr_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PANDASTACK_GUEST_ASLR", "sometimes")
    with pytest.raises(ValueError, match="guest_aslr"):
        HostConfig.from_env()


def test_fork_buffer_keep_time_comes_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert HostConfig().fork_buffer_s == 60.0
    monkeypatch.setenv("PANDASTACK_FORK_BUFFER_S", "0")
    assert HostConfig.from_env().fork_buffer_s == 0.0


def test_each_state_dir_has_its_own_fork_buffer(tmp_path: Path) -> None:
    one = HostConfig(state_dir=tmp_path / "a").fork_buffer_dir
    assert one == HostConfig(state_dir=tmp_path / "a").fork_buffer_dir
    assert one != HostConfig(state_dir=tmp_path / "b").fork_buffer_dir


def test_stream_huge_pages_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert HostConfig().stream_huge_pages == "auto"
    monkeypatch.setenv("PANDASTACK_STREAM_HUGE_PAGES", "off")
    assert HostConfig.from_env().stream_huge_pages == "off"
    monkeypatch.setenv("PANDASTACK_STREAM_HUGE_PAGES", "maybe")
    with pytest.raises(ValueError, match="stream_huge_pages"):
        HostConfig.from_env()


def test_stream_hugetlb_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    auto = HostConfig()
    assert auto.stream_hugetlb_mb is None
    # "auto": a pool only where freed memory goes back to the hypervisor (memory/huge_pool.py).
    assert auto.stream_hugetlb_pages(True, 24105) == AUTO_STREAM_HUGETLB_MB // 2
    assert auto.stream_hugetlb_pages(True, 4096) == 256  # an eighth of a small host
    assert auto.stream_hugetlb_pages(False, 24105) == 0
    monkeypatch.setenv("PANDASTACK_STREAM_HUGETLB_MB", "512")
    assert HostConfig.from_env().stream_hugetlb_pages(False, 4096) == 256
    monkeypatch.setenv("PANDASTACK_STREAM_HUGETLB_MB", "0")
    assert HostConfig.from_env().stream_hugetlb_pages(True, 24105) == 0
    monkeypatch.setenv("PANDASTACK_STREAM_HUGETLB_MB", "auto")
    assert HostConfig.from_env().stream_hugetlb_mb is None
    with pytest.raises(ValueError, match="stream_hugetlb_mb"):
        HostConfig(stream_hugetlb_mb=-2)
    one = HostConfig(state_dir=tmp_path / "a").hugetlb_claim
    assert one != HostConfig(state_dir=tmp_path / "b").hugetlb_claim
    assert one.parent == HostConfig(state_dir=tmp_path / "b").hugetlb_claim.parent


def test_an_empty_setting_is_an_unset_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # An environment file's `NAME=` line: not the working directory, not a ValueError.
    names = ("PANDASTACK_STATE_DIR", "PANDASTACK_FORK_BUFFER_S", "PANDASTACK_TB_SIZE_MB",
             "PANDASTACK_VOLUMES_DIR", "PANDASTACK_MEMORY_STAGE", "PANDASTACK_DNS")
    for name in names:
        monkeypatch.delenv(name, raising=False)
    default = HostConfig.from_env()
    for name in names:
        monkeypatch.setenv(name, " ")
    config = HostConfig.from_env()
    assert config.state_dir == default.state_dir
    assert config.fork_buffer_s == default.fork_buffer_s
    assert config.tb_size_mb == default.tb_size_mb
    assert config.volumes_root == default.volumes_root
    assert config.memory_stage_dir == default.memory_stage_dir
    assert config.dns == default.dns
