"""The agent client's operations, reached through an object that hands out its agent on demand
(`SandboxHandle.agent()`: it wakes a hibernated sandbox and reconnects a broken channel first).

Such a class names each operation once, ``stat = AgentCall(AgentClient.stat)``, instead of a
method that repeats the client's signature only to forward its arguments: the signature (and
its defaults) stay the client's, and type checkers see them through the descriptor.

The listings (guest operations whose row has an ``answer``) are not named at all: `add_listings`
gives such a class one method per listing, with the signature of the port's method of the same
name, whose arguments are the request's fields.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, Self, TypeVar, overload

from pandastack.guestproto.ops import OPERATIONS
from pandastack.host.agentlink.client import AgentClient

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class HasAgent(Protocol):
    async def agent(self) -> AgentClient: ...

    def guest_call(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Around each guest operation (the owner's error translation)."""
        ...


class AgentCall(Generic[P, R]):
    """A coroutine method of AgentClient, called on the owner's agent."""

    def __init__(self, method: Callable[Concatenate[AgentClient, P], Coroutine[Any, Any, R]]):
        self._method = method

    @overload
    def __get__(self, owner: None, cls: type | None = None) -> Self: ...

    @overload
    def __get__(self, owner: HasAgent,
                cls: type | None = None) -> Callable[P, Coroutine[Any, Any, R]]: ...

    def __get__(self, owner: HasAgent | None,
                cls: type | None = None) -> Self | Callable[P, Coroutine[Any, Any, R]]:
        if owner is None:
            return self
        method = self._method

        async def call(*args: P.args, **kwargs: P.kwargs) -> R:
            async with owner.guest_call():
                return await method(await owner.agent(), *args, **kwargs)

        return call


class AgentStream(Generic[P, T]):
    """An async-generator method of AgentClient, iterated on the owner's agent (which is asked
    for at the first step, as the client's own generator starts there)."""

    def __init__(self, method: Callable[Concatenate[AgentClient, P], AsyncGenerator[T, None]]):
        self._method = method

    @overload
    def __get__(self, owner: None, cls: type | None = None) -> Self: ...

    @overload
    def __get__(self, owner: HasAgent,
                cls: type | None = None) -> Callable[P, AsyncGenerator[T, None]]: ...

    def __get__(self, owner: HasAgent | None,
                cls: type | None = None) -> Self | Callable[P, AsyncGenerator[T, None]]:
        if owner is None:
            return self
        method = self._method

        async def stream(*args: P.args, **kwargs: P.kwargs) -> AsyncGenerator[T, None]:
            async with owner.guest_call():
                agent = await owner.agent()
                # Closed with the caller's iteration, so a stopped stream stops the guest's op.
                async with contextlib.aclosing(method(agent, *args, **kwargs)) as items:
                    async for item in items:
                        yield item

        return stream


def add_listings(cls: type[HasAgent], port: type) -> None:
    """Give ``cls`` a method per listing of the guest table, shaped as ``port``'s method of the
    same name (which every listing must have: tests/host/agentlink/test_listings.py)."""
    for name, op in OPERATIONS.items():
        if op.answer is not None:
            setattr(cls, name, _listing(name, getattr(port, name)))


def _listing(name: str, declared: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(declared)

    async def call(self: HasAgent, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        fields = dict(list(bound.arguments.items())[1:])  # self is not a field
        async with self.guest_call():
            return await (await self.agent()).listing(name, fields)

    return functools.update_wrapper(call, declared)
