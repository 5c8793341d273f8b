"""Request/response operations on one sandbox, as data: one `SandboxOperation` row per REST
call that takes a JSON body, passes its fields to one method of the sandbox's handle (the host
port's `SandboxPort`) and answers with that method's result as a model.

The server builds each row's route (`server/routes/operations.py`) and the SDK its call
(`sdk/_operations.py`) from the row, so such an operation is a request model, an answer model
and a row beside them in their wire module; no route or call builder is written for it.
Operations with their own flow (streams, uploads, status codes other than 200, queries) are
written by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any, Generic, TypeVar

from pandastack.wire.base import Strict

Request = TypeVar("Request", bound=Strict)
Answer = TypeVar("Answer", bound=Strict)


@dataclass(frozen=True)
class SandboxOperation(Generic[Request, Answer]):
    method: str
    path: str
    """Under `/v1/sandboxes/{sandbox_id}/`, e.g. ``files/<name>``."""
    request: type[Request]
    """The JSON body; its fields are the keyword arguments of the handle's method ``port``."""
    answer: type[Answer]
    """Read from the method's result (a dataclass) field by field; its strings from the
    guest are cleaned on the server (bytes that are not UTF-8 shown as U+FFFD)."""
    port: str
    operation_id: str
    summary: str
    description: str = ""

    def path_parts(self) -> list[str]:
        return self.path.split("/")


def operations_of(module: ModuleType) -> list[SandboxOperation[Any, Any]]:
    """The rows a wire module defines, in the order it defines them (its routes' order)."""
    return [v for v in vars(module).values() if isinstance(v, SandboxOperation)]
