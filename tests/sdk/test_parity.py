"""The sync and async twins expose the same surface: same public names, same parameters
(name, kind, default, annotation), same return annotation, with Async-prefixed types and
`await` as the only differences. Hand-mirrored twins drift; this test is what stops it."""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest

import pandastack
from pandastack.sdk import (
    AsyncClient,
    AsyncCodeInterpreter,
    AsyncCommands,
    AsyncFilesystem,
    AsyncHosts,
    AsyncKeys,
    AsyncProcess,
    AsyncPty,
    AsyncSandbox,
    AsyncSandboxes,
    AsyncSnapshots,
    AsyncTeams,
    AsyncTerminals,
    AsyncVolumes,
    AsyncWatch,
    Client,
    CodeInterpreter,
    Commands,
    Filesystem,
    Hosts,
    Keys,
    Process,
    Pty,
    Sandbox,
    Sandboxes,
    Snapshots,
    Teams,
    Terminals,
    Volumes,
    Watch,
)
from pandastack.sdk.events import (
    AsyncEvents,
    AsyncEventStream,
    AsyncWebhooks,
    Events,
    EventStream,
    Webhooks,
)
from pandastack.sdk.registries import AsyncRegistries, Registries

TWINS = [
    (Sandbox, AsyncSandbox),
    (Commands, AsyncCommands),
    (CodeInterpreter, AsyncCodeInterpreter),
    (Process, AsyncProcess),
    (Filesystem, AsyncFilesystem),
    (Client, AsyncClient),
    (Sandboxes, AsyncSandboxes),
    (Keys, AsyncKeys),
    (Snapshots, AsyncSnapshots),
    (Hosts, AsyncHosts),
    (Teams, AsyncTeams),
    (Volumes, AsyncVolumes),
    (Watch, AsyncWatch),
    (Terminals, AsyncTerminals),
    (Pty, AsyncPty),
    (Events, AsyncEvents),
    (EventStream, AsyncEventStream),
    (Webhooks, AsyncWebhooks),
    (Registries, AsyncRegistries),
]
# sync name -> async name of the protocol methods
DUNDERS = {"__init__": "__init__", "__enter__": "__aenter__", "__exit__": "__aexit__"}


def normalize(annotation: Any) -> str:
    """Annotation text with the twin differences removed (AsyncX -> X, Awaitable[X] -> X)."""
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    text = re.sub(r"\bAwaitable\[(.*)\]", r"\1", text)
    return re.sub(r"\bAsync(?=[A-Z])", "", text)


def public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def describe(obj: Any) -> tuple[Any, ...]:
    if isinstance(obj, property):
        assert obj.fget is not None
        return ("property", normalize(inspect.signature(obj.fget).return_annotation))
    sig = inspect.signature(obj)
    params = tuple(
        (p.name, p.kind, p.default, normalize(p.annotation)) for p in sig.parameters.values()
    )
    return ("callable", params, normalize(sig.return_annotation))


def member(cls: type, name: str) -> Any:
    return (
        inspect.getattr_static(cls, name)
        if isinstance(inspect.getattr_static(cls, name), property)
        else getattr(cls, name)
    )


@pytest.mark.parametrize(("sync", "async_"), TWINS, ids=lambda c: c.__name__)
def test_same_public_names(sync: type, async_: type) -> None:
    assert public(sync) == public(async_)


@pytest.mark.parametrize(("sync", "async_"), TWINS, ids=lambda c: c.__name__)
def test_same_signatures(sync: type, async_: type) -> None:
    names = {n: n for n in public(sync)} | {k: v for k, v in DUNDERS.items() if hasattr(sync, k)}
    assert names, sync
    for sync_name, async_name in names.items():
        s, a = member(sync, sync_name), member(async_, async_name)
        assert describe(s) == describe(a), f"{sync.__name__}.{sync_name}"


@pytest.mark.parametrize(("sync", "async_"), TWINS, ids=lambda c: c.__name__)
def test_async_twin_methods_are_coroutines(sync: type, async_: type) -> None:
    for sync_name, async_name in ({n: n for n in public(sync)} | DUNDERS).items():
        if not hasattr(sync, sync_name) or sync_name == "__init__":
            continue
        s, a = member(sync, sync_name), member(async_, async_name)
        if isinstance(s, property):
            assert isinstance(a, property), async_name
            continue
        assert not inspect.iscoroutinefunction(s), f"{sync.__name__}.{sync_name}"
        if inspect.isgeneratorfunction(s):  # a sync iterator's twin is an async iterator
            assert inspect.isasyncgenfunction(a), f"{async_.__name__}.{async_name}"
            continue
        assert inspect.iscoroutinefunction(a), f"{async_.__name__}.{async_name}"


@pytest.mark.parametrize("cls", [c for pair in TWINS for c in pair], ids=lambda c: c.__name__)
def test_public_api_is_documented(cls: type) -> None:
    assert inspect.getdoc(cls)
    for name in public(cls):
        assert inspect.getdoc(member(cls, name)), f"{cls.__name__}.{name} has no docstring"


def test_sandbox_surface_is_complete() -> None:
    """The surface promised by the issue, spelled out."""
    assert {
        "create",
        "connect",
        "list",
        "refresh",
        "exec",
        "lifecycle",
        "set_ttl",
        "set_persistent",
        "logs",
        "kill",
        "close",
        "id",
        "info",
        "commands",
        "filesystem",
        "pause",
        "resume",
        "snapshot",
        "fork",
        "hibernate",
        "wake",
    } <= public(Sandbox)
    assert {"list", "get", "delete"} <= public(Snapshots)
    assert "snapshots" in public(Client)
    assert {"list", "get", "drain", "undrain"} <= public(Hosts)
    assert "hosts" in public(Client)
    assert "snapshot" in inspect.signature(Sandbox.create).parameters
    assert inspect.signature(Sandbox.fork).parameters["count"].default == 1
    assert {"run", "start", "list", "connect"} <= public(Commands)
    assert {"pid", "wait", "kill", "send_signal", "send_stdin", "stream"} <= public(Process)
    assert inspect.isgeneratorfunction(Process.stream)
    start = inspect.signature(Commands.start).parameters
    assert {"timeout_seconds", "on_stdout", "on_stderr"} <= set(start)
    assert start["timeout_seconds"].default is None
    assert {"set_timeout", "is_running"} <= public(Sandbox)
    assert {
        "write",
        "read",
        "list",
        "stat",
        "exists",
        "mkdir",
        "remove",
        "rename",
        "upload",
        "download",
        "write_many",
        "watch",
    } <= public(Filesystem)
    assert list(inspect.signature(Filesystem.read).parameters) == ["self", "path", "format"]
    assert {"stop", "stopped"} <= public(Watch)
    assert "files" in public(Sandbox)
    assert {"list", "get", "create", "kill"} <= public(Sandboxes)
    exec_params = list(inspect.signature(Sandbox.exec).parameters)
    assert exec_params == [
        "self",
        "cmd",
        "timeout_seconds",
        "env",
        "cwd",
        "stdin",
        "on_stdout",
        "on_stderr",
        "max_output_bytes",
    ]
    assert inspect.signature(Sandbox.exec).parameters["timeout_seconds"].default == 60
    create = inspect.signature(Sandbox.create).parameters
    assert create["template"].default == "base" and create["persistent"].default is False
    assert all(
        create[n].kind is inspect.Parameter.KEYWORD_ONLY
        for n in ("api_url", "api_key", "timeout", "transport")
    )


def test_package_exports() -> None:
    for name in (
        "Sandbox",
        "AsyncSandbox",
        "Client",
        "AsyncClient",
        "ExecResult",
        "SandboxInfo",
        "FileEntry",
        "PandastackError",
        "APIError",
        "NotFoundError",
        "ConfigError",
        "AuthError",
        "InvalidRequestError",
        "RateLimitError",
        "SandboxError",
        "TimeoutError",
        "APIConnectionError",
        "ServerError",
        "TransportError",
        "__version__",
    ):
        assert hasattr(pandastack, name), name
    assert set(pandastack.__all__) <= set(dir(pandastack))


def test_every_list_of_sandboxes_returns_handles_of_live_ones_by_default() -> None:
    for fn in (Sandbox.list, AsyncSandbox.list, Sandboxes.list, AsyncSandboxes.list):
        params = inspect.signature(fn).parameters
        param = params["include_ended"]
        assert param.default is False and param.kind is inspect.Parameter.KEYWORD_ONLY, fn
        # One page of handles (a list with next_token), filtered and paged the same way.
        for name in ("template", "started_after", "limit", "next_token"):
            assert params[name].default is None, (fn, name)
            assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, (fn, name)
        assert normalize(inspect.signature(fn).return_annotation) == "SandboxPage[Sandbox]", fn
