"""The table of guest operations (pandastack.guestproto.ops) against what it describes: both
agents' dispatch tables (the reference agent's HANDLERS, the static agent's modules' HANDLERS read
from its source), the fields and replies each agent names, and spec/guest-protocol.md §5."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from pandastack.guest import agent as python_agent
from pandastack.guestproto import ops as guest_ops
from pandastack.guestproto.ops import (
    DATA_REPLIES,
    FINAL_REPLIES,
    METRICS_MAX_WINDOW_MS,
    METRICS_MIN_WINDOW_MS,
    METRICS_WINDOW_MS,
    OPERATIONS,
    REPLY_KINDS,
    Field,
    check_request,
    reply_of,
)

ROOT = Path(__file__).resolve().parents[2]
RUST_SRC = ROOT / "guest-agent" / "src"
PYTHON_SRC = ROOT / "src" / "pandastack" / "guest"
SPEC = ROOT / "spec" / "guest-protocol.md"
STREAM_ONLY = {"cancel"}
"""Frame types the spec gives a section of §5 although they are no request of their own."""


def _rust_dispatch() -> tuple[list[str], set[str]]:
    """(request types of the modules' HANDLERS that agent.rs's MODULES concatenates, in order
    and with repeats, STREAM_TYPES) of the static agent."""
    text = (RUST_SRC / "agent.rs").read_text()
    modules = re.search(r"const MODULES: &\[&\[\(&str, Handler\)\]\] = &\[(.*?)\];", text, re.S)
    assert modules is not None, "guest-agent/src/agent.rs has no MODULES"
    requests: list[str] = []
    for module in re.findall(r"(\w+)::HANDLERS", modules.group(1)):
        source = (RUST_SRC / f"{module}.rs").read_text()
        table = re.search(r"pub const HANDLERS: &\[\(&str, Handler\)\] = &\[(.*?)\];", source, re.S)
        assert table is not None, f"guest-agent/src/{module}.rs has no HANDLERS"
        requests += re.findall(r'\(\s*"(\w+)"\s*,', table.group(1))
    streams = re.search(r"const STREAM_TYPES: &\[&str\] = &\[(.*?)\];", text, re.S)
    assert streams is not None
    return requests, set(re.findall(r'"(\w+)"', streams.group(1)))


def test_every_static_agent_module_with_handlers_is_in_its_dispatch_table() -> None:
    """A module's HANDLERS left out of agent.rs's MODULES would go unanswered."""
    text = (RUST_SRC / "agent.rs").read_text()
    listed = set(re.findall(r"(\w+)::HANDLERS", text))
    having = {p.stem for p in RUST_SRC.glob("*.rs") if "pub const HANDLERS" in p.read_text()}
    assert len(having) > 5
    assert having == listed


def test_the_table_names_every_request_both_agents_dispatch_and_no_other() -> None:
    rust_ops, rust_streams = _rust_dispatch()
    assert len(rust_ops) > 20
    # `ping` is answered by both readers before the dispatch tables.
    assert 'if f.t == "ping"' in (RUST_SRC / "agent.rs").read_text()
    assert 'if t == "ping"' in (PYTHON_SRC / "agent.py").read_text()
    assert set(OPERATIONS) == set(python_agent.HANDLERS) | {"ping"}
    assert len(rust_ops) == len(set(rust_ops)), "a request in two static agent modules"
    assert set(OPERATIONS) == set(rust_ops) | {"ping"}
    host_streams = {t for op in OPERATIONS.values() for t in op.host_stream} | {"cancel"}
    assert host_streams == set(python_agent.STREAM_TYPES) == rust_streams


def _string_literals(folder: Path, glob: str) -> set[str]:
    return {m for path in folder.glob(glob) for m in re.findall(r'"(\w+)"', path.read_text())}


@pytest.mark.parametrize(("folder", "glob"), [(PYTHON_SRC, "*.py"), (RUST_SRC, "*.rs")],
                         ids=["python", "rust"])
def test_each_agent_names_every_field_and_reply_of_the_table(folder: Path, glob: str) -> None:
    """A field renamed in the table but not in an agent (or the other way) shows here."""
    named = _string_literals(folder, glob)
    fields = {f.name for op in OPERATIONS.values() for f in op.fields}
    assert fields - named == set()
    assert set(REPLY_KINDS) - named == set()


# --- the spec --------------------------------------------------------------------------


@dataclass(frozen=True)
class SpecField:
    name: str
    type: str | None
    optional: bool
    default: str | None
    choice: bool


def _operations_section() -> str:
    text = SPEC.read_text()
    start, end = text.index("## 5. Operations"), text.index("## 6. Errors")
    return text[start:end]


def _subsections() -> dict[str, str]:
    """Text of each `###` subsection of §5, under every request name its heading gives."""
    parts = re.split(r"^### (.+)$", _operations_section(), flags=re.M)
    out: dict[str, str] = {}
    for heading, body in zip(parts[1::2], parts[2::2], strict=True):
        for name in heading.split(" (")[0].split(" / "):
            out[name.strip()] = body
    return out


def _braced(text: str, start: int) -> str:
    """The text inside the braces that open at ``start``."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1 : i]
    raise AssertionError("unbalanced braces in the spec")


def _split_top(text: str, sep: str = ",") -> list[str]:
    """``text`` split at each ``sep`` outside brackets and braces."""
    items, depth, cur = [], 0, ""
    for ch in text:
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(ch, 0)
        if ch == sep and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    return [*items, cur]


def _alternatives(item: str) -> list[str]:
    """`cmd:str | argv:[str]` and `cmd|argv` are choices; `signal:int|null` is one type."""
    parts = [p.strip() for p in _split_top(item, "|")]
    if len(parts) > 1 and (":" not in item or all(":" in p for p in parts)):
        return parts
    return [item]


def _spec_fields(signature: str) -> list[SpecField]:
    fields: list[SpecField] = []
    for raw in _split_top(" ".join(signature.split())):
        item = raw.strip()
        optional = item.startswith("[") and item.endswith("]")
        if optional:
            item = item[1:-1]
        alternatives = _alternatives(item)
        for alt in alternatives:
            name, _, rest = alt.partition(":")
            typ, _, default = rest.partition("=")
            fields.append(SpecField(name.strip(), typ.strip() or None, optional,
                                    default.strip() or None, len(alternatives) > 1))
    return [f for f in fields if f.name != "id"]


def _request_signature(name: str, section: str) -> str:
    m = re.search(rf"(?<![\w`])`?{name} \{{", section)
    assert m is not None, f"spec §5 gives no `{name} {{...}}` request"
    return _braced(section, m.end() - 1)


def _spec_default(typ: str, text: str) -> object:
    if typ == "bool":
        return {"true": True, "false": False}[text]
    return int(text, 0)


def _spec_type(text: str) -> tuple[str, int | None]:
    """The table's notation for a spec type, and the lower bound it states (`int>0`)."""
    if text.endswith(">0"):
        return text[:-2], 1
    return text.replace(",...", ""), None


def test_every_operation_is_documented_and_no_stale_one() -> None:
    sections = _subsections()
    assert set(sections) - STREAM_ONLY == set(OPERATIONS)


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_the_spec_gives_each_request_the_fields_of_the_table(name: str) -> None:
    op = OPERATIONS[name]
    section = _subsections()[name]
    spec = {f.name: f for f in _spec_fields(_request_signature(name, section))}
    assert set(spec) == op.field_names
    for field in op.fields:
        s = spec[field.name]
        assert s.choice == (field.choice is not None), field.name
        assert s.optional == (not field.required), field.name
        if s.type is not None:
            typ, lo = _spec_type(s.type)
            assert typ == field.type, field.name
            if lo is not None:
                assert field.lo == lo, field.name
        if s.default is not None:
            assert field.default == _spec_default(field.type, s.default), field.name
        if field.lo is not None and field.hi is not None:
            assert f"{field.lo}..{field.hi}" in section, f"{name}.{field.name}: no bounds"
    for reply in op.replies:
        assert re.search(rf"`{reply}[ `{{]", section), f"{name}: reply {reply} not in the spec"


def test_every_reply_kind_has_one_role_and_the_spec_names_it() -> None:
    assert DATA_REPLIES.isdisjoint(FINAL_REPLIES)
    text = SPEC.read_text()
    for kind in REPLY_KINDS:
        assert f"`{kind}" in text, kind
    used = {t for op in OPERATIONS.values() for t in op.replies} | {"error", "credit"}
    assert used == set(REPLY_KINDS)


def test_the_spec_field_parser_reads_choices_types_and_defaults() -> None:
    """The parser the tests above rely on, on the spec's own notations."""
    got = _spec_fields("id, cmd:str | argv:[str,...], [env:{str:str}], [timeout_ms:int>0], "
                       "[stdin:bool=true]")
    assert got == [SpecField("cmd", "str", False, None, True),
                   SpecField("argv", "[str,...]", False, None, True),
                   SpecField("env", "{str:str}", True, None, False),
                   SpecField("timeout_ms", "int>0", True, None, False),
                   SpecField("stdin", "bool", True, "true", False)]
    assert [(f.name, f.optional, f.choice) for f in _spec_fields("id, [cmd|argv], [cols:int=80]")
            ] == [("cmd", True, True), ("argv", True, True), ("cols", True, False)]


def test_host_side_checks_of_requests_come_from_the_table() -> None:
    assert reply_of("procs") == "proc_list" and reply_of("metrics") == "metrics"
    with pytest.raises(ValueError, match="not by one reply"):
        reply_of("exec")
    check_request("stat", {"path": "/", "follow": False})
    with pytest.raises(ValueError, match="no field followw"):
        check_request("stat", {"path": "/", "followw": False})
    with pytest.raises(ValueError, match="no guest operation"):
        check_request("grepp", {})
    assert isinstance(OPERATIONS["metrics"].field("window_ms"), Field)


def test_the_static_agent_bounds_the_metrics_window_as_the_table_does() -> None:
    # Rust cannot import the table: its literals are held to it here instead.
    text = (RUST_SRC / "metrics.rs").read_text()
    default = re.search(r"const DEFAULT_WINDOW_MS: i128 = (\d+);", text)
    largest = re.search(r"const MAX_WINDOW_MS: i128 = (\d+);", text)
    smallest = re.search(r'arg_int\(&f\.header, "window_ms", Some\(DEFAULT_WINDOW_MS\), (\d+)\)',
                         text)
    assert default and largest and smallest, "metrics.rs no longer reads window_ms as expected"
    assert (int(default.group(1)), int(smallest.group(1)), int(largest.group(1))) == (
        METRICS_WINDOW_MS, METRICS_MIN_WINDOW_MS, METRICS_MAX_WINDOW_MS)


def test_the_static_agent_bounds_grep_and_glob_as_the_table_does() -> None:
    text = (RUST_SRC / "search.rs").read_text()
    for name in ("SEARCH_MAX_PATTERN_BYTES", "GREP_MAX_MATCHES", "GREP_MAX_LINE_BYTES",
                 "GREP_MAX_FILE_BYTES", "GREP_BINARY_PROBE_BYTES", "GREP_MAX_TOTAL_BYTES",
                 "GLOB_MAX_PATHS", "SEARCH_MAX_ENTRIES"):
        m = re.search(rf"^const {name}: \w+ = ([\d *]+);", text, re.M)
        assert m, f"search.rs has no `const {name}`"
        value = 1
        for factor in m.group(1).split("*"):
            value *= int(factor)
        assert value == getattr(guest_ops, name), name
