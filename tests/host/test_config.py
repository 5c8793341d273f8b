"""HostConfig: environment parsing and what follows from it (pure logic)."""

from __future__ import annotations

import pytest

from pandastack.host.config import HostConfig


@pytest.mark.parametrize(("setting", "accel", "args"), [
    ("auto", "tcg", " norandmaps"), ("auto", "kvm", ""),
    ("on", "tcg", ""), ("on", "kvm", ""),
    ("off", "tcg", " norandmaps"), ("off", "kvm", " norandmaps"),
])
def test_guest_aslr_gives_the_kernel_args(setting: str, accel: str, args: str) -> None:
    assert HostConfig(guest_aslr=setting).guest_kernel_args(accel) == args


def test_guest_aslr_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PANDASTACK_GUEST_ASLR", "on")
    assert HostConfig.from_env().guest_aslr == "on"


def test_a_bad_guest_aslr_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PANDASTACK_GUEST_ASLR", "sometimes")
    with pytest.raises(ValueError, match="guest_aslr"):
        HostConfig.from_env()
