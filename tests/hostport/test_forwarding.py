"""The wrappers of host ports answer every port method: `HostPool` (and `ClusterPool`) every
method of `RuntimePort` and `VolumePort`, `LeasedHost` every method of the four host ports.
A method the port gains fails here until the wrapper forwards it (one `Forwarded` line) or
writes it out. What a `Forwarded` line does is checked call by call: the pool sends it to the
host that holds the sandbox or snapshot, the leased host to its inner port only once the
membership allows, each with the arguments given and returning the answer unchanged."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from pandastack.hostport.errors import HostUnavailable, SandboxNotFound, VolumeNotFound
from pandastack.hostport.forwarding import HOST_PORTS, Forwarded, missing_methods
from pandastack.hostport.protocols import RuntimePort
from pandastack.hostport.volumes import VolumePort
from pandastack.registry.leased import LeasedHost
from pandastack.server.hosts.cluster import ClusterPool
from pandastack.server.hosts.pool import HostPool, _Held

PORT_METHODS = {name: getattr(port, name) for port in HOST_PORTS for name in vars(port)
                if not name.startswith("_") and callable(vars(port)[name])}


class Recorder:
    """A host with every host-port method: it records each call and answers with what it
    was asked (a coroutine for the port's coroutine methods)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, method: str) -> Any:
        if method not in PORT_METHODS:
            raise AttributeError(method)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((method, args, kwargs))
            answer = (self.name, method, args, kwargs)
            if not inspect.iscoroutinefunction(PORT_METHODS[method]):
                return answer

            async def later() -> Any:
                return answer
            return later()
        return call


class WithoutVolumes(Recorder):
    def __getattr__(self, method: str) -> Any:
        if method in vars(VolumePort):
            raise AttributeError(method)
        return super().__getattr__(method)


class Membership:
    def __init__(self) -> None:
        self.checks = 0
        self.refuse = False

    def check(self) -> tuple[str, int]:
        self.checks += 1
        if self.refuse:
            raise HostUnavailable("fenced")
        return "host-x", 1


def forwarded(cls: type) -> list[str]:
    return [name for klass in cls.__mro__ for name, value in vars(klass).items()
            if isinstance(value, Forwarded)]


def arguments(name: str, subject: object) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Arguments for the port method: `subject` first, a distinct marker for each other
    parameter (positional ones given by position, keyword-only ones by keyword)."""
    params = list(inspect.signature(PORT_METHODS[name]).parameters.values())[1:]
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for i, param in enumerate(params):
        value = subject if i == 0 else f"{name}.{param.name}"
        if param.kind is inspect.Parameter.KEYWORD_ONLY:
            kwargs[param.name] = value
        else:
            args.append(value)
    return tuple(args), kwargs


async def result(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


@pytest.mark.parametrize("cls, ports", [
    (HostPool, (RuntimePort, VolumePort)),
    (ClusterPool, (RuntimePort, VolumePort)),
    (LeasedHost, HOST_PORTS),
])
def test_every_port_method_is_forwarded_or_written(cls: type, ports: tuple[Any, ...]) -> None:
    assert missing_methods(cls, ports) == []


def test_a_method_left_to_the_protocol_or_getattr_is_missing() -> None:
    class Partial(RuntimePort):
        pause = Forwarded(RuntimePort.pause)

        def __getattr__(self, name: str) -> object:
            return None

    missing = missing_methods(Partial, (RuntimePort,))
    assert "RuntimePort.resume" in missing and "RuntimePort.pause" not in missing
    assert len(missing) == len(vars(RuntimePort).keys() & PORT_METHODS.keys()) - 1


async def test_the_pool_sends_each_call_to_the_host_that_holds_its_subject() -> None:
    a, b = Recorder("a"), Recorder("b")
    pool = HostPool({"a": a, "b": b})
    pool._sandboxes["sbx-on-b"] = _Held("b")
    pool._snapshots["snap-on-a"] = "a"
    names = forwarded(HostPool)
    assert {"get", "handle", "pause", "console_log", "snapshot_info"} <= set(names)
    for name in names:
        subject = "snap-on-a" if name == "snapshot_info" else "sbx-on-b"
        host = a if subject == "snap-on-a" else b
        args, kwargs = arguments(name, subject)
        answer = await result(getattr(pool, name)(*args, **kwargs))
        assert answer == (host.name, name, args, kwargs)
        assert host.calls[-1] == (name, args, kwargs)
    # By keyword too, and a sandbox the pool does not know is on no host.
    await pool.pause(sandbox_id="sbx-on-b")
    assert b.calls[-1] == ("pause", (), {"sandbox_id": "sbx-on-b"})
    with pytest.raises(SandboxNotFound):
        await pool.pause("sbx-nowhere")
    assert len(a.calls) + len(b.calls) == len(names) + 1


async def test_the_leased_host_forwards_only_once_the_membership_allows() -> None:
    inner, membership = Recorder("inner"), Membership()
    host = LeasedHost(inner, membership)  # type: ignore[arg-type]
    names = forwarded(LeasedHost)
    assert {"snapshot", "offer_migration", "send_snapshot", "create_volume"} <= set(names)
    assert not {"create", "fork", "wake", "kill", "complete_migration"} & set(names)
    for name in names:
        args, kwargs = arguments(name, "sbx-1")
        checks = membership.checks
        assert await result(getattr(host, name)(*args, **kwargs)) == \
            ("inner", name, args, kwargs)
        assert membership.checks == checks + 1
    assert [call[0] for call in inner.calls] == names

    membership.refuse = True
    for name in names:
        args, kwargs = arguments(name, "sbx-1")
        with pytest.raises(HostUnavailable):
            await result(getattr(host, name)(*args, **kwargs))
    assert len(inner.calls) == len(names)


async def test_a_leased_host_without_volumes_says_so() -> None:
    inner = WithoutVolumes("inner")
    host = LeasedHost(inner, Membership())  # type: ignore[arg-type]
    with pytest.raises(VolumeNotFound, match="keeps no volumes"):
        await host.get_volume("vol-1")
    assert inner.calls == []
    await host.pause("sbx-1")  # the rest still answers
    assert inner.calls == [("pause", ("sbx-1",), {})]
