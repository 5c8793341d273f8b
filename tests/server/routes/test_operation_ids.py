"""Every operation of the OpenAPI document has a curated camelCase operationId (what generated
clients name their methods by), unique, and none is FastAPI's default made of the function
name, the path and the method (`create_sandbox_v1_sandboxes_post`)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from pandastack.server.app import create_app
from pandastack.server.settings import Settings

SPEC = Path(__file__).resolve().parents[3] / "spec" / "openapi.json"
CAMEL_CASE = re.compile(r"^[a-z][a-z0-9]*(?:[A-Z][a-z0-9]*)*$")
DEFAULT_SUFFIX = re.compile(r"_v1_|_(?:get|post|put|patch|delete|options|head)$")


def operation_ids(document: dict[str, Any]) -> list[tuple[str, str]]:
    """(operationId, "METHOD path") of every operation."""
    return [(op.get("operationId", ""), f"{method.upper()} {path}")
            for path, ops in document["paths"].items() for method, op in ops.items()]


@pytest.mark.parametrize("source", ["app", "committed"])
def test_operation_ids_are_curated_camel_case_and_unique(source: str) -> None:
    document = (create_app(Settings()).openapi() if source == "app"
                else json.loads(SPEC.read_text()))
    ids = operation_ids(document)
    assert len(ids) > 40  # every route is in the document
    for operation_id, where in ids:
        assert not DEFAULT_SUFFIX.search(operation_id), f"{where}: FastAPI's default id"
        assert CAMEL_CASE.match(operation_id), f"{where}: {operation_id!r} is not camelCase"
    names = [operation_id for operation_id, _ in ids]
    assert len(set(names)) == len(names), sorted(n for n in names if names.count(n) > 1)


def test_operations_read_as_what_they_do() -> None:
    """Where the endpoint's function name is not the operation (`remove_snapshot`,
    `process_wait`), the route names it: one verb for each kind of act across the API."""
    by_route = {where: operation_id
                for operation_id, where in operation_ids(create_app(Settings()).openapi())}
    sbx = "/v1/sandboxes/{sandbox_id}"
    assert by_route["POST /v1/sandboxes"] == "createSandbox"
    assert by_route[f"POST {sbx}/exec"] == "execCommand"
    assert by_route[f"POST {sbx}/exec/stream"] == "execCommandStream"
    assert by_route["GET /v1/templates"] == "listTemplates"
    assert by_route["DELETE /v1/snapshots/{snapshot_id}"] == "deleteSnapshot"
    assert by_route[f"DELETE {sbx}/files"] == "deleteFile"
    assert by_route[f"POST {sbx}/processes/{{pid}}/wait"] == "waitProcess"
    assert by_route[f"GET {sbx}/code/contexts"] == "listCodeContexts"
    assert by_route[f"POST {sbx}/ports/{{port}}/signed-url"] == "createSignedUrl"
    assert by_route["GET /v1/templates/builds/{build_id}"] == "getTemplateBuild"
