"""The host API's request/response routes, built from the port's operation table
(`hostport.host_api.operations`): one route per row, its path, query and body parameters
typed from the port method's own signature, so that the OpenAPI document describes them and
FastAPI checks them. A row added there is served here with nothing written for it."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi import Path as PathParam

from pandastack.hostport.errors import SetupError, VolumeNotFound
from pandastack.hostport.host_api.codec import adapter
from pandastack.hostport.host_api.models import port_value
from pandastack.hostport.host_api.operations import BINARY, OPERATIONS, Operation
from pandastack.hostport.protocols import MigrationPort, RuntimePort, SnapshotTransferPort
from pandastack.hostport.volumes import VolumePort

KW = inspect.Parameter.KEYWORD_ONLY
# What a host that lacks an optional port answers its operations with.
_LACKING: dict[Any, Callable[[], Exception]] = {
    VolumePort: lambda: VolumeNotFound("this host keeps no volumes"),
    MigrationPort: lambda: SetupError("this host does not migrate sandboxes"),
    SnapshotTransferPort: lambda: SetupError("this host does not transfer snapshots"),
}


async def _target(op: Operation, host: RuntimePort, values: dict[str, Any]) -> Any:
    """What the operation is asked of: the sandbox the path names, or the host (as the
    optional port the row belongs to)."""
    if op.on_sandbox:
        return await host.get(values.pop("sandbox_id"))
    lacking = _LACKING.get(op.port)
    if lacking is not None and not isinstance(host, op.port):
        raise lacking()
    return host


def _arguments(op: Operation, values: dict[str, Any]) -> inspect.BoundArguments:
    body = values.pop("body", None)
    if body is not None and op.whole_body:
        (name,) = op.body_arguments
        values[name] = port_value(body)
    elif body is not None:
        for name in op.body_arguments:
            values[name] = port_value(getattr(body, op.renamed.get(name, name)))
    # Bound to the port's signature: positional where it is, so that an implementation's
    # own names for positional parameters do not matter.
    return op.signature.bind(**values)


def _answer(op: Operation, result: Any) -> Any:
    if op.result is None:
        return Response(status_code=204)
    if op.result is BINARY:
        return Response(result, media_type="application/octet-stream")
    if op.unwrap is not None:
        return op.result.model_validate({op.unwrap: result}, from_attributes=True)
    return adapter(op.result).validate_python(result, from_attributes=True)


def _parameters(op: Operation) -> list[inspect.Parameter]:
    hints = op.hints()
    signature = op.signature.parameters
    params = [inspect.Parameter("request", KW, annotation=Request)]
    for name in op.path_names:
        params.append(inspect.Parameter(
            name, KW, annotation=Annotated[hints.get(name, str), PathParam()]))
    for name in op.query_arguments:
        rule = dict(op.query.get(name, {}))
        default = rule.pop("default", signature[name].default)
        params.append(inspect.Parameter(
            name, KW, annotation=Annotated[hints[name], Query(**rule)],
            default=inspect.Parameter.empty if default is inspect.Parameter.empty
            else default))
    if op.body is not None:
        params.append(inspect.Parameter("body", KW, annotation=op.body))
    return params


def endpoint(op: Operation) -> Callable[..., Awaitable[Any]]:
    async def serve(request: Request, **values: Any) -> Any:
        target = await _target(op, request.app.state.host, values)
        bound = _arguments(op, values)
        return _answer(op, await getattr(target, op.name)(*bound.args, **bound.kwargs))

    serve.__name__ = op.name
    serve.__doc__ = inspect.getdoc(getattr(op.port, op.name))
    serve.__signature__ = inspect.Signature(_parameters(op))  # type: ignore[attr-defined]
    return serve


def _route_options(op: Operation) -> dict[str, Any]:
    if op.result is None:
        return {"response_class": Response, "response_model": None}
    if op.result is BINARY:
        return {"response_class": Response, "response_model": None, "responses": {200: {
            "content": {"application/octet-stream": {"schema": {"type": "string",
                                                                "format": "binary"}}},
            "description": "raw bytes"}}}
    return {"response_model": op.result}


def router() -> APIRouter:
    built = APIRouter()
    for op in OPERATIONS:
        built.add_api_route(op.path, endpoint(op), methods=[op.http], status_code=op.status,
                            operation_id=op.operation_id, tags=[op.tag],
                            **_route_options(op))
    return built
