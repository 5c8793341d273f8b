"""Wire types of terminals (`POST /v1/sandboxes/{id}/pty`, the WebSocket
`/v1/sandboxes/{id}/pty/{pid}`), shared by the server and the SDK. The WebSocket's messages
are described in PTY_WEBSOCKET (the API document's description carries it)."""

from __future__ import annotations

from pydantic import Field

from pandastack.rules import (
    MAX_ENV_ITEMS,
    PTY_DEFAULT_COLS,
    PTY_DEFAULT_ROWS,
    PTY_MAX_CONTROL_CHARS,
    PTY_MAX_DIM,
    PTY_MAX_INPUT_BYTES,
)
from pandastack.wire.base import Strict

# The terminal's bounds are the rules' (the host API holds to them too), under the names this
# module's users know.
MAX_DIM = PTY_MAX_DIM
DEFAULT_COLS = PTY_DEFAULT_COLS
DEFAULT_ROWS = PTY_DEFAULT_ROWS
MAX_INPUT = PTY_MAX_INPUT_BYTES
MAX_CONTROL = PTY_MAX_CONTROL_CHARS

PTY_WEBSOCKET = f"""Terminals: `POST /v1/sandboxes/{{id}}/pty` starts a process on a new
pseudo-terminal (the user's shell unless `cmd` is given) and answers its `pid`; the WebSocket
`GET /v1/sandboxes/{{id}}/pty/{{pid}}` (same API key, sent as `Authorization: Bearer` or
`X-API-Key` on the handshake) attaches to it, from any number of clients, as often as wanted.
Binary messages are the terminal's bytes, both ways: what the guest kept of its recent
output (256 KiB) comes first, then live output; what a client sends is typed into the
terminal (at most {MAX_INPUT} bytes per message; `\\u0003` is Ctrl-C). Text messages are
JSON control messages (at most {MAX_CONTROL} characters): a client sends
`{{"type": "resize", "cols": C, "rows": R}}` (1..{MAX_DIM}); the server sends, once the process
ended, `{{"type": "exit", "exit_code": N, "signal": S or null}}` and closes with 1000.
Closing the socket detaches: the process runs on (kill it with `POST .../processes/{{pid}}/
signal`). A refused handshake is an HTTP error envelope (401, 404 for an unknown pid, 400 for
a process without a terminal); a bad control message closes with 1008, an oversized message
with 1009, a failure of the host with 1011."""


class PtyCreateRequest(Strict):
    cols: int = Field(default=DEFAULT_COLS, ge=1, le=MAX_DIM)
    rows: int = Field(default=DEFAULT_ROWS, ge=1, le=MAX_DIM)
    cmd: str | list[str] | None = Field(
        default=None, min_length=1,
        description="a shell command line or an argv list; default: the user's login shell "
                    "(from the guest's passwd)")
    env: dict[str, str] | None = Field(default=None, max_length=MAX_ENV_ITEMS)
    cwd: str | None = Field(default=None, max_length=4096)
    user: str | None = Field(default=None, min_length=1, max_length=64,
                             description="a user of the guest's passwd (default: the "
                                         "template's USER, else root)")


class PtyInfo(Strict):
    pid: int
    cols: int
    rows: int
