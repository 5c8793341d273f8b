"""The guest's listings (rows of guestproto.ops with an `answer`) reach the sandbox handle
from the table alone (bound.add_listings): each has the port's method of its name, whose
arguments are the request's fields, and the handle calls the client's `listing` with them."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import typing
from collections.abc import Mapping
from typing import Any

import pytest

from pandastack.guestproto.ops import OPERATIONS
from pandastack.host.agentlink.bound import add_listings
from pandastack.host.runtime.sandbox import SandboxHandle
from pandastack.hostport.protocols import GuestListings, SandboxPort

LISTINGS = sorted(name for name, op in OPERATIONS.items() if op.answer is not None)


def test_the_listings_are_the_ports_and_only_those() -> None:
    assert LISTINGS, "no guest operation has an answer"
    declared = sorted(n for n, v in vars(GuestListings).items()
                      if inspect.iscoroutinefunction(v))
    assert declared == LISTINGS


@pytest.mark.parametrize("name", LISTINGS)
def test_a_listing_is_its_rows_fields_and_answer(name: str) -> None:
    op = OPERATIONS[name]
    method = getattr(SandboxPort, name)
    params = list(inspect.signature(method).parameters)[1:]
    assert sorted(params) == sorted(op.field_names)
    for field in op.fields:  # a default of the port is the guest's
        default = inspect.signature(method).parameters[field.name].default
        assert default is inspect.Parameter.empty if field.required else default == field.default
    assert typing.get_type_hints(method)["return"] is op.answer
    assert op.answer is not None
    fields = [f.name for f in dataclasses.fields(op.answer)]
    assert len(fields) == 2 and fields[1] == "truncated"


@pytest.mark.parametrize("name", LISTINGS)
def test_the_handle_has_each_with_the_ports_signature(name: str) -> None:
    built = vars(SandboxHandle).get(name)
    assert inspect.iscoroutinefunction(built), f"SandboxHandle.{name} was not built"
    assert inspect.signature(built) == inspect.signature(getattr(SandboxPort, name))


class Recorder:
    def __init__(self) -> None:
        self.asked: list[tuple[str, dict[str, Any]]] = []

    async def listing(self, name: str, fields: Mapping[str, Any]) -> str:
        self.asked.append((name, dict(fields)))
        return "answer"


class OnRecorder:
    def __init__(self) -> None:
        self.recorder = Recorder()

    async def agent(self) -> Any:
        return self.recorder

    def guest_call(self) -> contextlib.AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()


add_listings(OnRecorder, SandboxPort)


async def test_a_call_sends_its_arguments_as_fields_defaults_included() -> None:
    on: Any = OnRecorder()  # its listings are set at import: Any to reach them
    grep = on.grep
    assert await grep("/w", pattern="x") == "answer"
    assert await grep("/w", "y", ignore_case=True) == "answer"
    await on.glob("/w", "**/*.py")
    assert on.recorder.asked == [
        ("grep", {"path": "/w", "pattern": "x", "ignore_case": False}),
        ("grep", {"path": "/w", "pattern": "y", "ignore_case": True}),
        ("glob", {"path": "/w", "pattern": "**/*.py"}),
    ]
    with pytest.raises(TypeError):
        await grep("/w", "x", True)  # keyword-only, as the port has it
