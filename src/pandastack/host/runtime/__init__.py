"""Sandbox lifecycle on one machine: HostRuntime and what it keeps on disk."""

from pandastack.host.runtime.core import HostRuntime, SnapshotResult

__all__ = ["HostRuntime", "SnapshotResult"]
