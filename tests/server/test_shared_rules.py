"""The rules in pandastack.rules are the ones the server, the wire models, the template spec
and the host act on: one table of error codes and statuses, one set of id formats and limits.
Where a copy remains (the host's own bounds), the copy is held equal to the rule."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any, cast

import pytest

import pandastack.server
from pandastack import rules
from pandastack.host.runtime import core as host_core
from pandastack.host.runtime import records as host_records
from pandastack.host.runtime import saving as host_saving
from pandastack.host.runtime import snapshots as host_snapshots
from pandastack.server.web.errors import STATUS_CODES
from pandastack.templatespec.models import TemplateSpec
from pandastack.wire import resources as wire_resources
from pandastack.wire import sandboxes as wire

SERVER = Path(inspect.getfile(pandastack.server)).parent


def test_every_status_of_a_code_maps_back_to_a_code_with_that_status() -> None:
    assert set(rules.ERROR_STATUS.values()) <= set(STATUS_CODES)
    for status, code in STATUS_CODES.items():
        assert code in rules.ERROR_CODES
        if status not in (405, 415):  # statuses no code of ours stands for
            assert rules.ERROR_STATUS[code] == status, (status, code)
    assert STATUS_CODES[409] == "conflict"


def _api_errors_in_server() -> list[tuple[str, int, rules.ErrorCode]]:
    """(where, status, code) of every `ApiError(<status>, "<code>", ...)` the server raises."""
    found: list[tuple[str, int, rules.ErrorCode]] = []
    for path in sorted(SERVER.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "ApiError" and len(node.args) >= 2
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[1], ast.Constant)):
                # ApiError(status: int, code: ErrorCode): mypy holds the server's constants to it
                found.append((f"{path.name}:{node.lineno}", cast(int, node.args[0].value),
                              cast(rules.ErrorCode, node.args[1].value)))
    return found


def test_the_server_sends_each_code_with_its_status() -> None:
    raised = _api_errors_in_server()
    assert len(raised) > 30  # the scan sees the server's errors
    wrong = [(where, status, code) for where, status, code in raised
             if rules.ERROR_STATUS.get(code) != status]
    assert not wrong, f"ApiError status/code not as in pandastack.rules.ERROR_STATUS: {wrong}"


def _bounds(model: type[Any], field: str) -> tuple[Any, Any, Any]:
    prop = model.model_json_schema()["properties"][field]
    prop = next((p for p in prop.get("anyOf", [prop]) if p.get("type") == "integer"), prop)
    return prop.get("minimum"), prop.get("maximum"), model.model_fields[field].default


@pytest.mark.parametrize("model", [wire.CreateSandbox, wire_resources.BuildTemplate])
def test_wire_machine_shapes_are_the_rules(model: type[Any]) -> None:
    assert _bounds(model, "vcpus") == (rules.MIN_VCPUS, rules.MAX_VCPUS, rules.DEFAULT_VCPUS)
    assert _bounds(model, "memory_mb") == (rules.MIN_MEMORY_MB, rules.MAX_MEMORY_MB,
                                           rules.DEFAULT_MEMORY_MB)


def test_wire_limits_are_the_rules() -> None:
    assert _bounds(wire.CreateSandbox, "disk_mb")[:2] == (rules.MIN_DISK_MB, rules.MAX_DISK_MB)
    assert _bounds(wire.CreateSandbox, "ttl_seconds") == (1, rules.MAX_TTL_SECONDS,
                                                          rules.DEFAULT_TTL_SECONDS)
    network = wire.NetworkSpec.model_json_schema()["properties"]
    assert network["allow_out"]["maxItems"] == rules.MAX_NETWORK_RULES
    assert network["deny_out"]["maxItems"] == rules.MAX_NETWORK_RULES
    assert _bounds(wire.ForkRequest, "count")[1] == rules.MAX_FORK


def test_the_template_spec_starts_from_the_default_template() -> None:
    assert TemplateSpec().from_template == rules.DEFAULT_TEMPLATE


def test_the_hosts_copies_equal_the_rules() -> None:
    """host/ keeps its own constants for now (it may import pandastack.rules: a follow-up);
    until then they must not drift from the API's."""
    assert host_core.MAX_VCPUS == rules.MAX_VCPUS
    assert (host_core.MIN_MEMORY_MB, host_core.MAX_MEMORY_MB) == (rules.MIN_MEMORY_MB,
                                                                  rules.MAX_MEMORY_MB)
    assert host_core.MAX_DISK_MB == rules.MAX_DISK_MB
    assert vars(host_saving)["MAX_FORK"] == rules.MAX_FORK  # imported from the rules
    assert host_records.SANDBOX_ID_RE.pattern == rules.SANDBOX_ID_RE.pattern
    assert host_snapshots.SNAPSHOT_ID_RE.pattern == rules.SNAPSHOT_ID_RE.pattern


@pytest.mark.parametrize(("make", "pattern", "other"), [
    (rules.new_sandbox_id, rules.SANDBOX_ID_RE, rules.SNAPSHOT_ID_RE),
    (rules.new_snapshot_id, rules.SNAPSHOT_ID_RE, rules.BUILD_ID_RE),
    (rules.new_build_id, rules.BUILD_ID_RE, rules.SANDBOX_ID_RE),
])
def test_new_ids_have_their_format_and_no_other(make: Any, pattern: Any, other: Any) -> None:
    ids = {make() for _ in range(50)}
    assert len(ids) == 50
    assert all(pattern.match(i) and not other.match(i) for i in ids)


def test_builtin_template_names_are_the_hosts_table() -> None:
    from pandastack.host.templates.builtin import BUILTIN_TEMPLATES

    assert set(BUILTIN_TEMPLATES) == rules.BUILTIN_TEMPLATE_NAMES
