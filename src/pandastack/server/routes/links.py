"""OpenAPI links: which later calls an answer's ids feed (OpenAPI 3 `links` on a response).
Nothing reads them at run time; they document the API's workflows for clients, and they are
what schemathesis follows in the stateful test (tests/server/api/test_api_stateful.py), so that
its sequences reach the routes behind a real sandbox, snapshot, volume or webhook rather
than their 404s."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

Responses = dict[int | str, dict[str, Any]]

#: The operations that act on one sandbox and need nothing else named in their path (the
#: long-lived streams are left out: a sequence would wait on them).
SANDBOX_OPERATIONS = (
    "getSandbox", "deleteSandbox", "execCommand", "execCommandStream", "readFile", "writeFile",
    "writeFiles", "listFiles", "statFile", "makeDirectory", "renameFile", "deleteFile",
    "startProcess", "listProcesses", "pauseSandbox", "resumeSandbox", "hibernateSandbox",
    "wakeSandbox", "createSnapshot", "forkSandbox", "getLifecycle", "updateLifecycle",
    "getNetworkPolicy", "updateNetworkPolicy", "setNetworkPolicy", "getSandboxLogs",
    "getSandboxMetrics", "runCode", "createCodeContext", "listCodeContexts", "createPty",
    "createSignedUrl",
)


def _name(operation_id: str) -> str:
    return operation_id[:1].upper() + operation_id[1:]


def links(statuses: int | Iterable[int], operations: Iterable[str],
          parameters: Mapping[str, str]) -> Responses:
    """`responses=` of a route whose answer (at each of `statuses`) links to `operations`,
    each given `parameters` (path parameter name -> runtime expression).

    No link leads to a create (say, a snapshot to `createSandbox {"snapshot": id}`):
    schemathesis starts its sequences only at operations no link leads to."""
    found: dict[str, Any] = {
        _name(op): {"operationId": op, "parameters": dict(parameters)} for op in operations}
    codes = [statuses] if isinstance(statuses, int) else list(statuses)
    return {code: {"links": found} for code in codes}


def merged(*parts: Responses) -> Responses:
    """Several `responses=` dicts as one; a status named twice gets the keys of both."""
    out: Responses = {}
    for part in parts:
        for code, response in part.items():
            out[code] = {**out.get(code, {}), **response}
    return out


def sandbox_links(statuses: int | Iterable[int], sandbox_id: str = "$response.body#/id",
                  ) -> Responses:
    """Links from an answer that names a sandbox to everything done to one sandbox."""
    return links(statuses, SANDBOX_OPERATIONS, {"sandbox_id": sandbox_id})
