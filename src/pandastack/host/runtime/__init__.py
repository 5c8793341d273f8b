"""Sandbox lifecycle on one machine: HostRuntime and what it keeps on disk."""

from pandastack.host.runtime.core import HostRuntime
from pandastack.hostport.results import SnapshotResult

__all__ = ["HostRuntime", "SnapshotResult"]
