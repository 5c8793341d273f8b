"""The port's operation table (hostport/host_api/operations.py) against the port, the host
API and its client: every port method is a row or is written by hand (with its route); every
row is served and called; and each row's arguments and answer cross the real app and client
unchanged, through a port that records what it was asked."""

from __future__ import annotations

import inspect
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pandastack.guest.procs import KILLED_GRACE
from pandastack.guestproto.ops import GlobResult, GrepMatch, GrepResult
from pandastack.host.api import create_host_app
from pandastack.host.config import HostConfig
from pandastack.hostport.host_api.operations import BY_NAME, HAND_WRITTEN, OPERATIONS
from pandastack.hostport.network import NetworkPolicy
from pandastack.hostport.protocols import (
    MigrationPort,
    RuntimePort,
    SandboxPlacement,
    SandboxPort,
    SnapshotTransferPort,
)
from pandastack.hostport.registries import RegistryLogin
from pandastack.hostport.results import (
    FileInfo,
    GuestMetrics,
    ImageInfo,
    SnapshotInfo,
    SnapshotResult,
)
from pandastack.hostport.volumes import HostVolume, VolumeBackup, VolumeMountRequest, VolumePort
from pandastack.server.hostclient import HostClient, RemoteSandbox
from pandastack.server.hostclient.sandbox import EXEC_ANSWER_GRACE_S
from tests.host.api.fake_host import served

TOKEN = "t0ken"
HOST_PORTS = (RuntimePort, MigrationPort, SnapshotTransferPort, VolumePort)


def members(port: Any) -> set[str]:
    """The methods and properties a port declares, its base protocols' included (SandboxPort
    has the guest's listings from GuestListings)."""
    ours = [k for k in port.__mro__ if k.__module__.startswith("pandastack.")]
    return {name for k in ours for name, value in vars(k).items() if not name.startswith("_")
            and (callable(value) or isinstance(value, property))}


def test_every_port_method_is_a_row_or_written_by_hand() -> None:
    rows = {op.name for op in OPERATIONS}
    assert len(rows) == len(OPERATIONS), "a port method in two rows"
    assert not rows & set(HAND_WRITTEN)
    declared = set().union(*(members(p) for p in (SandboxPort, *HOST_PORTS)))
    assert declared - {"id", "state"} == rows | set(HAND_WRITTEN)
    for op in OPERATIONS:
        assert op.name in members(op.port), f"{op.name} is no method of {op.port.__name__}"
        assert set(op.path_names) - {"sandbox_id"} <= set(op.arguments), op.name
        assert set(op.query) <= set(op.query_arguments), op.name
        if op.body is not None and not op.whole_body:
            wire = {op.renamed.get(a, a) for a in op.body_arguments}
            assert wire == set(op.body.model_fields), f"{op.name}: body fields {wire}"


def test_every_operation_is_served_and_called() -> None:
    document = create_host_app(object(), "unused").openapi()  # type: ignore[arg-type]
    served_ids = {operation["operationId"]: (method.upper(), path)
                  for path, methods in document["paths"].items()
                  for method, operation in methods.items()}
    for op in OPERATIONS:
        assert served_ids[op.operation_id] == (op.http, "/v1" + op.path)
    for operation_id in HAND_WRITTEN.values():
        assert not operation_id or operation_id in served_ids or operation_id == "connectPty"
    for port, client in ((SandboxPort, RemoteSandbox), *((p, HostClient) for p in HOST_PORTS)):
        for name in members(port) - {"id", "state"}:
            method = inspect.getattr_static(client, name, None)
            assert method is not None and method is not inspect.getattr_static(port, name), \
                f"{client.__name__} lacks {name}"
    for op in OPERATIONS:  # a built method shows the port's own signature and docs
        built = getattr(RemoteSandbox if op.on_sandbox else HostClient, op.name)
        declared = getattr(op.port, op.name)
        assert inspect.signature(built) == inspect.signature(declared), op.name
        assert built.__doc__ == declared.__doc__, op.name


class FakeSandbox:
    def __init__(self, sandbox_id: str, calls: list[tuple[str, Any]]) -> None:
        self.id = sandbox_id
        self.state = "paused"
        self.forked_from: str | None = None
        self._calls = calls

    def is_alive(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return _recording(name, self._calls, SandboxPort)


class Recorder:
    """A host port that answers every row with CASES' value, noting what it was asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def get(self, sandbox_id: str) -> Any:
        """Also the route's lookup of a sandbox's operations (of "sbx-1": not noted)."""
        if sandbox_id != "sbx-1":
            self.calls.append(("get", {"sandbox_id": sandbox_id}))
        return FakeSandbox(sandbox_id, self.calls)

    def __getattr__(self, name: str) -> Any:
        port = next((p for p in HOST_PORTS if name in members(p)), None)
        if port is None:
            raise AttributeError(name)
        return _recording(name, self.calls, port)


def _recording(name: str, calls: list[tuple[str, Any]], port: Any) -> Any:
    signature = inspect.signature(getattr(port, name))

    async def record(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(None, *args, **kwargs)
        bound.apply_defaults()
        calls.append((name, {k: v for k, v in bound.arguments.items() if k != "self"}))
        return returned(name)
    return record


POLICY = NetworkPolicy(False, ("10.0.0.0/8",), ("example.com",))
INFO = SnapshotInfo(id="snap-1", name="n", source="sbx-1", template="base", template_path="/t",
                    vcpus=2, memory_mb=1024, disk_bytes=10, layers=("a",), created_at=1.5,
                    state_bytes=3, volumes=({"volume_id": "vol-1"},))
VOLUME = HostVolume("vol-1", 64, 1.0, None, ("sbx-1",))
FILE = FileInfo("f", "/w/f", "file", 3, 0o644, 2.0)
SANDBOX = object()  # stands for a sandbox: the client gets a RemoteSandbox of FakeSandbox

# name -> (args, kwargs, what the port returns)
CASES: dict[str, tuple[tuple[Any, ...], dict[str, Any], Any]] = {
    "create": ((), {"template": "python", "vcpus": 2, "memory_mb": 1024, "disk_mb": 2048,
                    "sandbox_id": "sbx-9", "network": POLICY,
                    "volumes": [VolumeMountRequest("vol-1", "/mnt", True)]}, SANDBOX),
    "get": (("sbx-2",), {}, SANDBOX),
    "list_sandboxes": ((), {}, [SANDBOX]),
    "kill": (("sbx-1",), {}, None),
    "pause": (("sbx-1",), {}, None),
    "resume": (("sbx-1",), {}, None),
    "hibernate": (("sbx-1",), {}, None),
    "wake": (("sbx-1",), {}, None),
    "snapshot": (("sbx-1", "n"), {"internal": True},
                 SnapshotResult(INFO, 2.5, "background")),
    "fork": (("sbx-1", 2), {}, [SANDBOX, SANDBOX]),
    "update_network": (("sbx-1", POLICY), {}, POLICY),
    "placement": (("sbx-1",), {}, SandboxPlacement(POLICY, "10.0.0.2")),
    "console_log": (("sbx-1", 4), {}, b"\x00b\xff"),
    "prepare_template": (("python",), {"vcpus": 2, "memory_mb": 1024}, None),
    "prune_build_cache": ((3,), {}, ["snap-1"]),
    "inspect_image": (("reg.example/app:1",), {"registry_logins": {
        "reg.example": RegistryLogin("u", "p@ss")}}, ImageInfo(
        "reg.example/app:1", "sha256:" + "a" * 64, "sha256:" + "b" * 64, 2, 4096,
        ("8080/tcp",))),
    "list_snapshots": ((), {"include_internal": True}, [INFO]),
    "snapshot_info": (("snap-1",), {}, INFO),
    "delete_snapshot": (("snap-1",), {}, None),
    "offer_migration": (("sbx-1",), {}, {"offer": 1}),
    "accept_migration": (("sbx-1", {"offer": 1}), {}, {"ticket": [1]}),
    "migrate": (("sbx-1", {"ticket": [1]}), {}, {"downtime_ms": 3.5}),
    "complete_migration": (("sbx-1", {"downtime_ms": 3.5}), {}, None),
    "release_migrated": (("sbx-1",), {}, None),
    "abort_migration": (("sbx-1",), {}, None),
    "offer_snapshot": (("sbx-1",), {}, {"offer": "x"}),
    "accept_snapshot": (({"offer": "x"},), {}, {"ticket": "y"}),
    "send_snapshot": (("snap-1", {"ticket": "y"}), {}, None),
    "create_volume": (("vol-1", 64), {}, VOLUME),
    "list_volumes": ((), {}, [VOLUME]),
    "get_volume": (("vol-1",), {}, VOLUME),
    "resize_volume": (("vol-1", 128), {}, VOLUME),
    "delete_volume": (("vol-1",), {}, None),
    "backup_volume": (("vol-1", "bk-1"), {}, VolumeBackup("bk-1", "vol-1", 64, 9, 2.0)),
    "restore_volume": (("bk-1", "vol-2"), {}, VOLUME),
    "delete_volume_backup": (("bk-1",), {}, None),
    "spawn": ((["sleep", "1"],), {"env": {"A": "1"}, "cwd": "/w", "user": "root",
                                  "timeout": 5.0}, 42),
    "procs": ((), {}, [{"pid": 1, "cmd": "init"}]),
    "signal": ((42, 15), {}, None),
    "send_stdin": ((42, b"\x00x\xff"), {"eof": True}, None),
    "pty_create": ((), {"cols": 100, "rows": 30, "cmd": "bash"}, 7),
    "list_dir": (("/w",), {}, [FILE]),
    "stat": (("/w/f",), {}, FILE),
    "mkdir": (("/w/d",), {"parents": False}, None),
    "remove": (("/w/d",), {"recursive": True}, None),
    "rename": (("/a", "/b"), {}, None),
    "grep": (("/w", "a b"), {"ignore_case": True},
             GrepResult([GrepMatch("/w/\udcfe", 3, "xa\udcff")], True)),
    "glob": (("/w", "**/*.py"), {}, GlobResult(["/w/a.py", "/w/\udcfe.py"], False)),
    "create_code_context": (("python", "/w"), {}, {"id": "c1"}),
    "list_code_contexts": ((), {}, [{"id": "c1"}]),
    "delete_code_context": (("c1",), {}, None),
    "restart_code_context": (("c1",), {}, None),
    "metrics": ((500,), {}, GuestMetrics(12.5, 2, 3, 4, 5, 6, 500)),
}


def returned(name: str) -> Any:
    value = CASES[name][2]
    if value is SANDBOX:
        return FakeSandbox("sbx-9", [])
    if isinstance(value, list) and value and value[0] is SANDBOX:
        return [FakeSandbox("sbx-9", []) for _ in value]
    return value


def test_the_exec_grace_margins_nest() -> None:
    """Past an exec's timeout, each hop waits for the one inside it: the guest reports the
    exit once the killed tree is gone, the host's guest-agent client waits agent_timeout_s
    for that, and the host API's client waits EXEC_ANSWER_GRACE_S for the host's answer."""
    assert KILLED_GRACE < HostConfig.agent_timeout_s < EXEC_ANSWER_GRACE_S


def test_every_row_has_a_case() -> None:
    assert set(CASES) == set(BY_NAME)


@pytest.fixture
async def agent() -> AsyncIterator[tuple[HostClient, Recorder]]:
    directory = Path(tempfile.mkdtemp(prefix="pop-", dir="/tmp"))  # short: a socket in it
    host = Recorder()
    try:
        async with served(host, TOKEN, directory) as url, HostClient(url, TOKEN) as client:
            yield client, host
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def test_each_row_crosses_unchanged(agent: tuple[HostClient, Recorder]) -> None:
    client, host = agent
    sandbox = client.handle("sbx-1")
    for op in OPERATIONS:
        args, kwargs, value = CASES[op.name]
        target = sandbox if op.on_sandbox else client
        host.calls.clear()
        got = await getattr(target, op.name)(*args, **kwargs)
        expected = inspect.signature(getattr(op.port, op.name)).bind(None, *args, **kwargs)
        expected.apply_defaults()
        asked = {k: v for k, v in expected.arguments.items() if k != "self"}
        assert host.calls == [(op.name, asked)], op.name
        if value is SANDBOX or (isinstance(value, list) and value and value[0] is SANDBOX):
            sandboxes = got if isinstance(got, list) else [got]
            made = args[0] if op.name == "get" else "sbx-9"
            assert [(s.id, s.state, s.is_alive()) for s in sandboxes] == \
                [(made, "paused", False)] * len(sandboxes), op.name
            assert all(isinstance(s, RemoteSandbox) for s in sandboxes)
        else:
            assert got == value, op.name
