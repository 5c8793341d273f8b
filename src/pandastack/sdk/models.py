"""The result types the SDK returns. They are the wire types of `pandastack.wire`, re-exported.

The SDK decodes replies leniently: fields a newer server adds are ignored, so an old SDK keeps
working against a new server.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pandastack.wire.resources import (
    CreatedKey,
    DrainResult,
    HostInfo,
    HostState,
    KeyInfo,
    VolumeAttachment,
    VolumeInfo,
    VolumeSnapshotInfo,
)
from pandastack.wire.sandboxes import (
    AttachedVolume,
    CodeContext,
    CodeError,
    ExecResult,
    FileEntry,
    ForkResult,
    Lifecycle,
    Logs,
    NetworkSpec,
    ProcessInfo,
    SandboxInfo,
    SandboxMetrics,
    SandboxState,
    SnapshotInfo,
    VolumeMount,
    WriteResult,
)
from pandastack.wire.search import GlobMatches, GrepMatches, TextMatch
from pandastack.wire.usage import (
    QuotaInfo,
    QuotaUse,
    RateCard,
    UsageQuantities,
    UsageReport,
    UsageRow,
)

__all__ = [
    "AsyncOutputCallback",
    "AttachedVolume",
    "CodeContext",
    "CodeError",
    "CreatedKey",
    "DrainResult",
    "ExecResult",
    "FileEntry",
    "ForkResult",
    "GlobMatches",
    "GrepMatches",
    "HostInfo",
    "HostState",
    "KeyInfo",
    "Lifecycle",
    "Logs",
    "NetworkSpec",
    "OutputCallback",
    "ProcessInfo",
    "QuotaInfo",
    "QuotaUse",
    "RateCard",
    "SandboxInfo",
    "SandboxMetrics",
    "SandboxState",
    "SnapshotInfo",
    "TextMatch",
    "UsageQuantities",
    "UsageReport",
    "UsageRow",
    "VolumeAttachment",
    "VolumeInfo",
    "VolumeMount",
    "VolumeSnapshotInfo",
    "WriteResult",
]

#: Called with each chunk of a command's output text, as it arrives.
OutputCallback = Callable[[str], object]
#: The async twin's callback: a plain function or a coroutine function (awaited).
AsyncOutputCallback = Callable[[str], Awaitable[object] | object]
