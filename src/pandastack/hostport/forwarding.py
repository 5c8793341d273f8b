"""Host-port methods that a wrapper of other ports only passes on (`HostPool` sends a call to
the host that holds its sandbox, `LeasedHost` to its inner port once the membership allows).

Such a wrapper names each of them once, ``pause = Forwarded(RuntimePort.pause)``, instead of
a method that repeats the port's signature to forward its arguments: the signature stays the
port's (type checkers see it through the descriptor, and the wrapper is still checked against
the protocol), and the wrapper says in one method, `forward_target`, where a call goes.
`port_methods` lists what a wrapper must answer, so a test fails when the port gains a method
that a wrapper neither forwards nor writes out.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, Self, TypeVar, cast, overload

from .protocols import MigrationPort, RuntimePort, SnapshotTransferPort
from .volumes import VolumePort

P = ParamSpec("P")
R = TypeVar("R")

HOST_PORTS: tuple[Any, ...] = (RuntimePort, MigrationPort, SnapshotTransferPort, VolumePort)
"""The host-level port protocols (`SandboxPort` is one sandbox's, reached through `get`)."""


def port_methods(port: Any) -> tuple[str, ...]:
    """The methods a protocol declares (its own, not `Protocol`'s machinery)."""
    return tuple(name for name, value in vars(port).items()
                 if not name.startswith("_") and callable(value))


def _declaring_port(method: Callable[..., Any]) -> Any:
    for port in HOST_PORTS:
        if vars(port).get(method.__name__) is method:
            return port
    raise TypeError(f"{method.__qualname__} is not a method of a host port")


@dataclass(frozen=True)
class PortCall:
    """A forwarded call, as its wrapper's `forward_target` sees it."""

    name: str
    port: Any  # the protocol that declares the method
    subject: str  # the name of the method's first parameter ("sandbox_id", ...), or ""
    key: Any  # that argument's value (None when the method takes none)


class Forwards(Protocol):
    def forward_target(self, call: PortCall) -> Any:
        """The port that answers `call` (raising if none may)."""
        ...


class Forwarded(Generic[P, R]):
    """A port method passed unchanged to `owner.forward_target(call)`'s same-named method.
    For a coroutine method that target is chosen when the call is awaited, as the written-out
    method it replaces did (so a refusal is raised where the call is awaited)."""

    def __init__(self, method: Callable[Concatenate[Any, P], R]) -> None:
        self.name = method.__name__
        self.port = _declaring_port(method)
        params = list(inspect.signature(method).parameters)[1:]
        self.subject = params[0] if params else ""
        self.is_async = inspect.iscoroutinefunction(method)
        self.__doc__ = method.__doc__

    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> PortCall:
        key = args[0] if args else kwargs.get(self.subject)
        return PortCall(self.name, self.port, self.subject, key)

    @overload
    def __get__(self, owner: None, cls: type | None = None) -> Self: ...

    @overload
    def __get__(self, owner: Forwards, cls: type | None = None) -> Callable[P, R]: ...

    def __get__(self, owner: Forwards | None, cls: type | None = None) -> Self | Callable[P, R]:
        if owner is None:
            return self
        name = self.name
        if self.is_async:
            async def forward_async(*args: P.args, **kwargs: P.kwargs) -> Any:
                target = owner.forward_target(self._call(args, kwargs))
                return await getattr(target, name)(*args, **kwargs)

            return cast(Callable[P, R], forward_async)

        def forward(*args: P.args, **kwargs: P.kwargs) -> R:
            target = owner.forward_target(self._call(args, kwargs))
            return cast(R, getattr(target, name)(*args, **kwargs))

        return forward


def missing_methods(cls: type, ports: tuple[Any, ...]) -> list[str]:
    """The methods of `ports` that `cls` neither forwards nor writes out (a class that only
    inherits the protocol's stub, or reaches it through `__getattr__`, lacks it)."""
    missing: list[str] = []
    for port in ports:
        for name in port_methods(port):
            owner = next((k for k in cls.__mro__ if name in vars(k)), None)
            if owner is None or owner in HOST_PORTS or owner is port:
                missing.append(f"{port.__name__}.{name}")
    return missing
