"""The call of a request/response sandbox operation, built from its row
(`pandastack.wire.operations`): the twins' methods pass their arguments here, so no call
builder is written per operation."""

from __future__ import annotations

from typing import Any, TypeVar

from pandastack.sdk._base import Call, encode, model_decoder, sandbox_path
from pandastack.wire.base import Strict
from pandastack.wire.operations import SandboxOperation

Answer = TypeVar("Answer", bound=Strict)


def operation_call(op: SandboxOperation[Any, Answer], sandbox_id: str,
                   **fields: Any) -> Call[Answer]:
    """``op``'s request with ``fields`` as its body, validated here first (None: the server's
    default); raises `InvalidRequestError` before anything is sent."""
    return Call(op.method, sandbox_path(sandbox_id, *op.path_parts()), model_decoder(op.answer),
                json=encode(op.request, **fields))
