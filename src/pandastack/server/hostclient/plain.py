"""The host API's request/response calls, built from the port's operation table
(`hostport.host_api.operations`): each row becomes a method of `HostClient` or
`RemoteSandbox` with the port method's own signature and docstring. A row added there is
called here with nothing written for it.

mypy does not see methods set on a class at import: the classes declare a `__getattr__`
for the type checker only, so that they still count as the port (the protocols keep the
signatures); tests/server/hostclient/test_operations.py checks each port method is really there."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from pandastack.hostport.host_api.models import SandboxInfo, port_value
from pandastack.hostport.host_api.operations import BINARY, OPERATIONS, Operation

from .calls import API, Caller, parse


def _url(op: Operation, values: dict[str, Any], sandbox_id: str | None) -> str:
    def part(name: str) -> str:
        value = sandbox_id if name == "sandbox_id" and op.on_sandbox else values[name]
        return quote(str(value), safe="")  # ids come from callers, not from us

    path = op.path
    for name in op.path_names:
        path = path.replace("{" + name + "}", part(name))
    return API + path


def _body(op: Operation, values: dict[str, Any]) -> Any:
    if op.body is None:
        return None
    if op.whole_body:
        (name,) = op.body_arguments
        return op.body.model_validate(values[name], from_attributes=True)
    fields = {op.renamed.get(name, name): values[name] for name in op.body_arguments}
    return op.body.model_validate(fields, from_attributes=True)


def _params(op: Operation, values: dict[str, Any]) -> dict[str, Any] | None:
    return {name: values[name] for name in op.query_arguments} or None


def call(op: Operation) -> Callable[..., Awaitable[Any]]:
    """The client method of `op`, for a class with `_caller` (and, for a sandbox's
    operations, `id`)."""
    signature = op.signature

    async def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        caller: Caller = self._caller
        read = None if op.wait is None else getattr(caller.timeouts, op.wait)
        response = await caller.call(op.http, _url(op, values, getattr(self, "id", None)),
                                     json=_body(op, values), params=_params(op, values),
                                     read=read)
        if op.result is None:
            return None
        if op.result is BINARY:
            return response.content
        value = parse(op.result, response.content, caller.address)
        if op.unwrap is not None:
            value = getattr(value, op.unwrap)
        return _port_value(caller, value)

    functools.update_wrapper(method, getattr(op.port, op.name))  # its name, docs, signature
    return method


def _port_value(caller: Caller, value: Any) -> Any:
    from .sandbox import RemoteSandbox  # the sandbox's class is built from this module

    if isinstance(value, SandboxInfo):
        return RemoteSandbox(caller, value)
    if isinstance(value, list):
        return [_port_value(caller, v) for v in value]
    return port_value(value)


def install(cls: type, *, on_sandbox: bool) -> None:
    """Give `cls` a method per row of the table (the sandbox's rows, or the host's)."""
    for op in OPERATIONS:
        if op.on_sandbox != on_sandbox:
            continue
        if op.name in vars(cls):
            raise TypeError(f"{cls.__name__}.{op.name} is written by hand and is a row of "
                            "the operation table: drop one")
        setattr(cls, op.name, call(op))
