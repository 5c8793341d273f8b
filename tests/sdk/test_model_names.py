"""`pandastack.sdk.models` re-exports each wire module's `__all__` (issue 35: a new result model
is named once, beside its class): the public names stay the ones the SDK has always offered,
each the wire package's own class."""

from __future__ import annotations

import pandastack.sdk.models as models
from pandastack.wire import registries, resources, sandboxes, search, usage

# The names before the re-export was derived (commit 8e30c23's hand-written list), and those
# added since: RegistryCredentials and RegistryCredentialsList (issue 37, 5aabeda).
PUBLIC = {
    "AsyncOutputCallback", "AttachedVolume", "CodeContext", "CodeError", "CreatedKey",
    "DrainResult", "ExecResult", "FileEntry", "ForkResult", "GlobMatches", "GrepMatches",
    "HostInfo", "HostState", "KeyInfo", "Lifecycle", "Logs", "NetworkSpec", "OutputCallback",
    "ProcessInfo", "QuotaInfo", "QuotaUse", "RateCard", "RegistryCredentials",
    "RegistryCredentialsList", "SandboxInfo", "SandboxMetrics",
    "SandboxState", "SnapshotInfo", "TextMatch", "UsageQuantities", "UsageReport", "UsageRow",
    "VolumeAttachment", "VolumeInfo", "VolumeMount", "VolumeSnapshotInfo", "WriteResult",
}


def test_public_names_unchanged() -> None:
    assert sorted(models.__all__) == sorted(PUBLIC)
    assert len(models.__all__) == len(set(models.__all__))
    assert {n for n in dir(models) if not n.startswith("_")} - {
        "annotations", "Awaitable", "Callable"} == PUBLIC


def test_each_name_is_the_wire_model() -> None:
    for module in (registries, resources, sandboxes, search, usage):
        for name in module.__all__:
            assert getattr(models, name) is getattr(module, name), name
