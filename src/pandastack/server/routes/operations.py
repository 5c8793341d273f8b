"""The routes of the REST API's request/response sandbox operations, built from their rows
(`pandastack.wire.operations`): one endpoint per row that resolves the running sandbox, calls
the row's method of its handle with the body's fields and answers the result as the row's
model."""

from __future__ import annotations

import dataclasses
import inspect
from types import ModuleType
from typing import Any

from fastapi import APIRouter

from pandastack.wire.operations import SandboxOperation, operations_of

from ..accounts.auth import CurrentPrincipal, Principal
from ..sandboxes.service import SandboxService
from ..web.errors import clean_text
from .deps import SandboxId, Service


def add_operations(router: APIRouter, module: ModuleType) -> None:
    """Add a route to ``router`` for every row ``module`` defines."""
    for op in operations_of(module):
        router.add_api_route(f"/sandboxes/{{sandbox_id}}/{op.path}", endpoint(op),
                             methods=[op.method], response_model=op.answer,
                             operation_id=op.operation_id, summary=op.summary,
                             description=op.description)


def endpoint(op: SandboxOperation[Any, Any]) -> Any:
    async def call(sandbox_id: str, body: Any, who: Principal, service: SandboxService) -> Any:
        _, handle = await service.running(who.team, sandbox_id)
        result = await getattr(handle, op.port)(**dict(body))
        return op.answer.model_validate(guest_strings_cleaned(result))

    # FastAPI reads the parameters (path, body, dependencies) from the signature.
    param = inspect.Parameter
    call.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
        param("sandbox_id", param.POSITIONAL_OR_KEYWORD, annotation=SandboxId),
        param("body", param.POSITIONAL_OR_KEYWORD, annotation=op.request),
        param("who", param.POSITIONAL_OR_KEYWORD, annotation=CurrentPrincipal),
        param("service", param.POSITIONAL_OR_KEYWORD, annotation=Service),
    ], return_annotation=op.answer)
    call.__name__ = call.__qualname__ = op.port
    return call


def guest_strings_cleaned(value: object) -> object:
    """A result as plain data, its strings (names and text from the guest, which may carry
    surrogate escapes of bytes that are not UTF-8) shown with U+FFFD."""
    if isinstance(value, str):
        return clean_text(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: guest_strings_cleaned(getattr(value, f.name))
                for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [guest_strings_cleaned(v) for v in value]
    if isinstance(value, dict):
        return {k: guest_strings_cleaned(v) for k, v in value.items()}
    return value
