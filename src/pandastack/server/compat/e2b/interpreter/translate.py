"""E2B's code interpreter wire, translated from and to ours: pure functions, no I/O (the
routes are routes.py)."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from pandastack.hostport.results import CodeEvent
from pandastack.rules import MAX_ENV_ITEMS
from pandastack.server.routes.deps import check_text
from pandastack.server.web.errors import clean_text
from pandastack.wire.sandboxes import MAX_CODE_CHARS

from ..errors import E2bError

MAX_LANGUAGE_CHARS = 32
MAX_ID_CHARS = 1024  # longer is a bad request; an id our interpreter never gave is a 404
# The names our interpreter takes in a run's env (kernel_server.py refuses the whole env else).
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# MIME types E2B's SDKs read as named fields of a result; the rest go to `extra`.
RESULT_FIELDS = {
    "text/plain": "text", "text/html": "html", "text/markdown": "markdown",
    "image/svg+xml": "svg", "image/png": "png", "image/jpeg": "jpeg",
    "application/pdf": "pdf", "text/latex": "latex", "application/json": "json",
    "application/javascript": "javascript", "e2b/data": "data", "e2b/chart": "chart",
}
# Our interpreter sends every value as a string (JSON ones encoded); these fields are objects.
JSON_FIELDS = frozenset({"json", "data", "chart"})


def line(obj: dict[str, Any]) -> bytes:
    # ASCII only: the SDKs split lines as str.splitlines does, which also breaks at U+2028,
    # U+0085 and the like; escaped, a line break can only be the one that ends the object.
    return json.dumps(obj, ensure_ascii=True, separators=(",", ":")).encode() + b"\n"


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def result_object(data: dict[str, str], is_main_result: bool) -> dict[str, Any]:
    """One of our results (MIME type -> string) as E2B's `result` line."""
    out: dict[str, Any] = {"type": "result"}
    extra: dict[str, str] = {}
    for mime, value in data.items():
        mime, value = clean_text(mime), clean_text(value)
        name = RESULT_FIELDS.get(mime)
        if name is None:
            extra[mime] = value
        elif name in JSON_FIELDS:
            parsed = _json_value(value)
            if parsed is None:
                extra[mime] = value
            else:
                out[name] = parsed
        else:
            out[name] = value
    text = out.get("text")
    # E2B shows a string's value without its repr quotes (`'hi'` is `hi`), and code written
    # for it compares `execution.text` so.
    if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        out["text"] = text[1:-1]
    out["extra"] = extra
    out["is_main_result"] = is_main_result
    return out


def event_lines(event: CodeEvent, now_ns: int) -> list[bytes]:
    """Our code event as E2B's lines (`end` is two: the count, then the end)."""
    if event.type in ("stdout", "stderr"):
        return [line({"type": event.type, "text": clean_text(event.text),
                      "timestamp": now_ns})]
    if event.type == "result":
        return [line(result_object(event.data or {}, event.is_main_result))]
    if event.type == "error":
        return [line({"type": "error", "name": clean_text(event.name),
                      "value": clean_text(event.value),
                      "traceback": clean_text(event.traceback)})]
    if event.type == "end":
        count = [] if event.execution_count is None else [
            line({"type": "number_of_executions", "execution_count": event.execution_count})]
        return [*count, line({"type": "end_of_execution"})]
    return []  # an event type E2B has no word for


def unexpected_end(message: str) -> list[bytes]:
    """A run that failed after its 200 went out: the SDK shows it as `execution.error`."""
    return [line({"type": "error", "name": "UnexpectedEndOfExecution",
                  "value": clean_text(message), "traceback": ""}),
            line({"type": "unexpected_end_of_execution"})]


@dataclasses.dataclass(frozen=True)
class RunRequest:
    code: str
    context_id: str | None
    language: str | None
    env: dict[str, str] | None


def optional_text(body: dict[str, Any], name: str, limit: int) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise E2bError(400, f"'{name}' must be a string")
    if len(value) > limit:
        raise E2bError(400, f"'{name}' is over {limit} characters")
    check_text(value, name)
    return value


def language_of(body: dict[str, Any]) -> str | None:
    """E2B's language names as ours (`js` is javascript; our interpreter knows the other
    aliases and refuses what it does not run)."""
    language = optional_text(body, "language", MAX_LANGUAGE_CHARS)
    if language is None or not language.strip():
        return None
    language = language.strip().lower()
    return {"js": "javascript", "ts": "typescript"}.get(language, language)


def parse_run(body: dict[str, Any]) -> RunRequest:
    code = body.get("code")
    if not isinstance(code, str):
        raise E2bError(400, "'code' must be a string")
    if len(code) > MAX_CODE_CHARS:
        raise E2bError(400, f"'code' is over {MAX_CODE_CHARS} characters")
    if "\x00" in code:
        raise E2bError(400, "'code' must not contain NUL bytes")
    context_id = optional_text(body, "context_id", MAX_ID_CHARS) or None
    language = language_of(body)
    if context_id is not None and language is not None:
        raise E2bError(400, "give context_id or language, not both")
    env = body.get("env_vars")
    if env is not None:
        if not isinstance(env, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise E2bError(400, "'env_vars' must map names to strings")
        if len(env) > MAX_ENV_ITEMS:
            raise E2bError(400, f"'env_vars' has more than {MAX_ENV_ITEMS} variables")
        check_text(env, "env_vars")
    return RunRequest(code, context_id, language, env or None)


def _utf8(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def run_env(sandbox_env: dict[str, Any] | None,
            env_vars: dict[str, str] | None) -> dict[str, str] | None:
    """A run's env: its env_vars over the sandbox's (its template's ENV and the create's
    envs). E2B's code sees the envs a sandbox was created with; our interpreter started
    before they were known (from the template's snapshot), so each run carries them.
    Sandbox names our interpreter would refuse are left out, as are those past its bound
    (the run's own come first): one odd create-time name must not fail every run."""
    merged = dict(env_vars or {})
    for name, value in (sandbox_env or {}).items():
        if len(merged) >= MAX_ENV_ITEMS:
            break
        if name not in merged and isinstance(value, str) and ENV_NAME.fullmatch(name) \
                and "\x00" not in value and _utf8(value):
            merged[name] = value
    return merged or None


def context_object(data: dict[str, object]) -> dict[str, str]:
    cwd = data.get("cwd")
    return {"id": clean_text(str(data.get("id", ""))),
            "language": clean_text(str(data.get("language") or "")),
            "cwd": clean_text(str(cwd or ""))}
