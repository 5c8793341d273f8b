"""The choice that puts the binary agent into images (ADR 0038, the default since ADR 0039): the
init starts it where it started the Python agent, and the choice is part of the image's
content key."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from pandastack.host.images import build
from pandastack.host.images.rootfs import AGENT_BINARY, init_for_binary_agent
from pandastack.hostport.errors import SetupError


def test_the_init_starts_the_binary_instead_of_python() -> None:
    init = build.read_asset(build.ROOTFS_INIT_ASSET)
    changed = init_for_binary_agent(init)
    assert b"python3 -m pandastack_guest" not in changed
    assert f"exec /{AGENT_BINARY} --guest".encode() in changed
    # Only that line differs: the cgroup move, the restart loop and the rest stay.
    diff = [(a, b) for a, b in zip(init.splitlines(), changed.splitlines(), strict=True)
            if a != b]
    assert len(diff) == 1


def test_an_unexpected_init_is_refused() -> None:
    with pytest.raises(SetupError):
        init_for_binary_agent(b"#!/bin/sh\nexec something-else\n")


def test_the_setting_chooses_the_agent(monkeypatch: pytest.MonkeyPatch,
                                       binary_agent: str) -> None:
    monkeypatch.delenv(build.GUEST_AGENT_ENV, raising=False)  # the default is the binary
    assert build.guest_agent_binary() == Path(binary_agent).read_bytes()
    monkeypatch.setenv(build.GUEST_AGENT_ENV, "python")
    assert build.guest_agent_binary() is None
    monkeypatch.setenv(build.GUEST_AGENT_ENV, "binary")
    assert build.guest_agent_binary() == Path(binary_agent).read_bytes()
    monkeypatch.setenv(build.GUEST_AGENT_ENV, "rust")
    with pytest.raises(SetupError, match="binary' or 'python"):
        build.guest_agent_binary()


def test_the_binary_is_static(binary_agent: str) -> None:
    """The guest has no Rust runtime and its glibc may differ: the binary must ask for no
    program interpreter (no PT_INTERP header), so nothing is loaded at its start."""
    data = Path(binary_agent).read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2  # ELF64
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    types = [struct.unpack_from("<I", data, phoff + k * phentsize)[0] for k in range(phnum)]
    assert types and 3 not in types  # PT_INTERP
    assert os.access(binary_agent, os.X_OK)
