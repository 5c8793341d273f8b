"""The guest operations as data: one row per request type of spec/guest-protocol.md §5, with
its request fields (types, defaults, bounds), the reply kinds the agent answers it with, and
whether it streams; and every reply kind with the role it plays on the host's channel.

The host's channel takes its reply lists from here (REPLY_KINDS, DATA_REPLIES, FINAL_REPLIES),
its client the reply each single-answer request expects (`reply_of`) and the field names a
request may carry (`check_request`). tests/guest/test_op_table.py holds this table to both
agents' dispatch tables and to the spec. Type names are the spec's notation.

Bounds of single operations that both sides need are here too, written once.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from .frames import MAX_CHUNK

# --- bounds of single operations ---------------------------------------------------------
ENTROPY_BYTES = 64
"""Payload of `init`: the host's entropy for the guest's RNG."""
METRICS_WINDOW_MS = 200
"""`metrics`' CPU window when the request names none."""
METRICS_MIN_WINDOW_MS = 10
METRICS_MAX_WINDOW_MS = 2000
"""The guest clamps a `window_ms` above this to it (below the minimum is EINVAL)."""
PTY_COLS = 80
PTY_ROWS = 24
PTY_MAX_DIM = 1000
"""Largest `cols` and `rows` of a terminal (and of a `resize`)."""
MAX_SIGNAL = 64
"""Largest `sig` of a `signal`."""
STDIN_MAX_BYTES = MAX_CHUNK
"""Payload of one `stdin` request (by pid)."""
WRITE_FILE_MODE = 0o644
SEARCH_MAX_PATTERN_BYTES = 1024
"""Longest `grep` or `glob` pattern (UTF-8 bytes); longer, or empty, is EINVAL."""
GREP_MAX_MATCHES = 1000
"""Matches of one `grep`; past them it stops and says `truncated`."""
GREP_MAX_LINE_BYTES = 1024
"""A match's `text` is its line cut to this many bytes."""
GREP_MAX_FILE_BYTES = 8 * 2**20
"""`grep` skips a file bigger than this (as it skips binary files)."""
GREP_BINARY_PROBE_BYTES = 8192
"""A file with a NUL byte among its first this many bytes is binary: `grep` skips it."""
GREP_MAX_TOTAL_BYTES = 64 * 2**20
"""Bytes one `grep` reads in all; the file that would pass it is not read (`truncated`)."""
GLOB_MAX_PATHS = 10_000
"""Paths of one `glob`; past them it stops and says `truncated`."""
SEARCH_MAX_ENTRIES = 100_000
"""Directory entries one `grep` or `glob` reads in all (a walk of a huge tree is bounded
before its answer is); the directory that would pass it stops the walk (`truncated`)."""


# --- answers of the listing operations -----------------------------------------------------
# A listing streams one JSON array as `data` and says `truncated` in its `eof`; the host reads
# it into its row's `answer`: the array is the dataclass's first field, then `truncated`.
@dataclass(frozen=True)
class GrepMatch:
    path: str
    line: int
    """Counted from 1."""
    text: str
    """The line without its newline, cut to GREP_MAX_LINE_BYTES bytes."""


@dataclass(frozen=True)
class GrepResult:
    matches: list[GrepMatch]
    truncated: bool
    """A bound (matches, bytes read) stopped the search: there may be more."""


@dataclass(frozen=True)
class GlobResult:
    paths: list[str]
    truncated: bool
    """GLOB_MAX_PATHS stopped the walk: there may be more."""


class Role(Enum):
    """What a reply kind does to its operation on the host's channel."""

    DATA = "data"
    """Bytes under the credit window of §4; more may follow."""
    FINAL = "final"
    """The operation's last frame: nothing may follow it on that id."""
    PROGRESS = "progress"
    """A reply that is not data and not the last (`entries` is the last when ``more`` is false)."""
    CONTROL = "control"
    """Flow control (`credit`), not a reply of any one operation."""


REPLY_KINDS: dict[str, Role] = {
    "pong": Role.FINAL,
    "ok": Role.FINAL,
    "error": Role.FINAL,
    "exit": Role.FINAL,
    "written": Role.FINAL,
    "eof": Role.FINAL,
    "spawned": Role.FINAL,
    "proc_list": Role.FINAL,
    "info": Role.FINAL,
    "metrics": Role.FINAL,
    "stdout": Role.DATA,
    "stderr": Role.DATA,
    "data": Role.DATA,
    "events": Role.DATA,
    "attached": Role.PROGRESS,
    "replay": Role.PROGRESS,
    "file": Role.PROGRESS,
    "entries": Role.PROGRESS,
    "watching": Role.PROGRESS,
    "credit": Role.CONTROL,
}
"""Every frame type the agent may send on an operation's id (id 0 has `hello`, `started` and
`error` of its own: §3)."""
DATA_REPLIES = frozenset(t for t, r in REPLY_KINDS.items() if r is Role.DATA)
FINAL_REPLIES = frozenset(t for t, r in REPLY_KINDS.items() if r is Role.FINAL)


@dataclass(frozen=True, slots=True)
class Field:
    """One request field. ``default`` None: absent means "none" (or the field is required)."""

    name: str
    type: str
    required: bool = False
    default: object = None
    lo: int | None = None
    hi: int | None = None
    choice: str | None = None
    """Fields of one choice (``cmd`` | ``argv``): at most one is sent; ``required`` then says
    that one of them must be."""


@dataclass(frozen=True, slots=True)
class Operation:
    name: str
    fields: tuple[Field, ...]
    replies: tuple[str, ...]
    """Reply kinds besides `error` (and the `credit` an agent grants for host data), in the
    order they come."""
    payload: str = ""
    """What the request's payload holds ("" none)."""
    host_stream: tuple[str, ...] = ()
    """Frame types the host may send on the operation's id while it runs, beside `cancel`."""
    answer: type | None = None
    """A listing's answer (above): the host's client and the sandbox handle's method of the
    same name are built from the row (`host/agentlink/bound.py`)."""

    @property
    def streaming(self) -> bool:
        """Whether the agent answers with data under the credit window (§4)."""
        return any(REPLY_KINDS[t] is Role.DATA for t in self.replies)

    @property
    def field_names(self) -> frozenset[str]:
        return frozenset(f.name for f in self.fields)

    def field(self, name: str) -> Field:
        return next(f for f in self.fields if f.name == name)


_PATH = Field("path", "str", required=True)
_PID = Field("pid", "int", required=True, lo=1)
_COMMAND = (
    Field("cmd", "str", required=True, choice="command"),
    Field("argv", "[str]", required=True, choice="command"),
    Field("env", "{str:str}"),
    Field("cwd", "str"),
)
_TIMEOUT = Field("timeout_ms", "int", lo=1)
_USER = Field("user", "str")

_TABLE = (
    Operation("ping", (), ("pong",)),
    Operation("init", (Field("time_ns", "int", required=True),
                       Field("hostname", "str", required=True),
                       Field("machine_id", "str", required=True)),
              ("ok",), payload=f"{ENTROPY_BYTES} bytes"),
    Operation("exec", (*_COMMAND, _TIMEOUT, Field("stdin", "bool", default=False), _USER),
              ("stdout", "stderr", "exit"), host_stream=("stdin", "stdin_eof", "signal", "credit")),
    Operation("spawn", (*_COMMAND, _TIMEOUT, Field("stdin", "bool", default=True), _USER),
              ("spawned",)),
    Operation("spawn_attach", (*_COMMAND, _TIMEOUT, Field("stdin", "bool", default=True), _USER),
              ("attached", "stdout", "stderr", "exit"), host_stream=("credit",)),
    Operation("attach", (_PID,), ("replay", "stdout", "stderr", "exit"), host_stream=("credit",)),
    Operation("pty", (*(Field(f.name, f.type, choice=f.choice) for f in _COMMAND), _USER,
                      Field("cols", "int", default=PTY_COLS, lo=1, hi=PTY_MAX_DIM),
                      Field("rows", "int", default=PTY_ROWS, lo=1, hi=PTY_MAX_DIM)),
              ("spawned",)),
    Operation("pty_attach", (_PID,), ("attached", "stdout", "exit"),
              host_stream=("stdin", "resize", "credit")),
    Operation("procs", (), ("proc_list",)),
    Operation("signal", (_PID, Field("sig", "int", required=True, lo=0, hi=MAX_SIGNAL)), ("ok",)),
    Operation("stdin", (_PID,), ("ok",), payload=f"bytes (at most {STDIN_MAX_BYTES})"),
    Operation("stdin_eof", (_PID,), ("ok",)),
    Operation("read_file", (_PATH, Field("offset", "int", default=0, lo=0),
                            Field("length", "int", lo=0)),
              ("file", "data", "eof"), host_stream=("credit",)),
    Operation("write_file", (_PATH, Field("mode", "int", default=WRITE_FILE_MODE, lo=0),
                             Field("append", "bool", default=False)),
              ("written",), host_stream=("data", "eof")),
    Operation("list", (_PATH,), ("entries",)),
    Operation("stat", (_PATH, Field("follow", "bool", default=True)), ("info",)),
    Operation("mkdir", (_PATH, Field("parents", "bool", default=True)), ("ok",)),
    Operation("remove", (_PATH, Field("recursive", "bool", default=False)), ("ok",)),
    Operation("rename", (Field("src", "str", required=True), Field("dst", "str", required=True)),
              ("ok",)),
    Operation("sync", (), ("ok",)),
    Operation("watch", (_PATH, Field("recursive", "bool", default=True)),
              ("watching", "events", "eof"), host_stream=("credit",)),
    Operation("metrics", (Field("window_ms", "int", default=METRICS_WINDOW_MS,
                                lo=METRICS_MIN_WINDOW_MS, hi=METRICS_MAX_WINDOW_MS),),
              ("metrics",)),
    Operation("mount_volume", (Field("serial", "str", required=True), _PATH,
                               Field("size_bytes", "int", required=True, lo=1),
                               Field("read_only", "bool", default=False)),
              ("ok",)),
    Operation("unmount_volume", (_PATH,), ("ok",)),
    Operation("freeze_volume", (_PATH,), ("ok",)),
    Operation("grep", (_PATH, Field("pattern", "str", required=True),
                       Field("ignore_case", "bool", default=False)),
              ("data", "eof"), host_stream=("credit",), answer=GrepResult),
    Operation("glob", (_PATH, Field("pattern", "str", required=True)),
              ("data", "eof"), host_stream=("credit",), answer=GlobResult),
    Operation("code", (), ("data", "eof"), payload="JSON object with a str \"op\"",
              host_stream=("credit",)),
)

OPERATIONS: dict[str, Operation] = {op.name: op for op in _TABLE}
"""Every request type, by name (`ping` included: the agents answer it in their reader)."""


def reply_of(name: str) -> str:
    """The one reply of a request that has exactly one (besides `error`)."""
    replies = OPERATIONS[name].replies
    if len(replies) != 1:
        raise ValueError(f"{name} is answered by {replies}, not by one reply")
    return replies[0]


def check_request(name: str, fields: dict[str, Any]) -> None:
    """Raise ValueError for a request type or field the table does not have: a host-side
    slip, caught before it reaches an agent (which would answer ENOSYS, or ignore the field)."""
    op = OPERATIONS.get(name)
    if op is None:
        raise ValueError(f"no guest operation {name!r}")
    unknown = fields.keys() - op.field_names
    if unknown:
        raise ValueError(f"{name}: no field {', '.join(sorted(unknown))} in the guest protocol")
