"""Helpers shared by tests (kept out of conftest so test modules can import them)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from pandastack.host.sandbox import SandboxHandle
from pandastack.host.vmm import iter_cmdlines

SandboxFactory = Callable[..., Awaitable[SandboxHandle]]


def qemu_pids_under(directory: Path) -> list[int]:
    """Live QEMU processes whose command line mentions `directory`."""
    prefix = str(directory)
    return [pid for pid, argv in iter_cmdlines()
            if "qemu" in argv[0] and any(prefix in a for a in argv)]
