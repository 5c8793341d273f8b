"""The rules the server, the SDK, the template spec and the host all hold to, in one place:
machine-shape limits, the formats of the ids the server makes, the default template, and the
error codes of the envelope with the HTTP status each stands for.

Plain constants, no pydantic models and no imports from the rest of pandastack, so that every
part can import it: `wire` (whose models quote these bounds) imports the template spec, so the
template spec's default base template cannot come from `wire`; it comes from here.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from pathlib import Path
from typing import Literal, get_args

#: Where a host keeps its images, templates, snapshots and sandboxes, and a single-machine
#: server its database, unless PANDASTACK_HOME says otherwise.
DEFAULT_HOME = Path("/var/lib/pandastack")

# -- machine shape ------------------------------------------------------------------------

MIN_VCPUS = 1
MAX_VCPUS = 8
DEFAULT_VCPUS = 1
MIN_MEMORY_MB = 128
MAX_MEMORY_MB = 16384
DEFAULT_MEMORY_MB = 512
MIN_DISK_MB = 256
MAX_DISK_MB = 1 << 20

# -- sandbox lifetime and request sizes ----------------------------------------------------

DEFAULT_TTL_SECONDS = 300
MAX_TTL_SECONDS = 30 * 24 * 3600
MAX_EXEC_TIMEOUT_SECONDS = 24 * 3600
MAX_METADATA_ITEMS = 64
MAX_ENV_ITEMS = 256
#: Entries per list (`allow_out`, `deny_out`) of a network policy.
MAX_NETWORK_RULES = 256
#: Children of one fork.
MAX_FORK = 16
#: What one exec's result keeps of each of its stdout and stderr, in MiB: the default of
#: PANDASTACK_MAX_EXEC_OUTPUT_MB, and the most that setting may say (a result is one JSON
#: body, held whole in the server's memory while it is sent).
DEFAULT_EXEC_OUTPUT_MB = 64
MAX_EXEC_OUTPUT_MB = 1024

# -- terminals (the WebSocket of the public API and of the host API) ----------------------

#: A terminal's size when its request names none.
PTY_DEFAULT_COLS = 80
PTY_DEFAULT_ROWS = 24
#: Largest `cols` and `rows` of a terminal (the guest agent holds to its own bound as well).
PTY_MAX_DIM = 1000
#: Largest binary message (keyboard input) a terminal's WebSocket takes; a paste is cut into
#: these.
PTY_MAX_INPUT_BYTES = 64 * 1024
#: Largest text (JSON control) message a terminal's WebSocket takes.
PTY_MAX_CONTROL_CHARS = 1024

# -- templates ----------------------------------------------------------------------------

#: What a sandbox (and a template build's FROM) starts from when it names no template.
DEFAULT_TEMPLATE = "base"
#: Most stages a multi-stage template build may have, its last (the template) included: each
#: earlier one is a build VM of its own, run one after the other (ADR 0046's addendum).
MAX_TEMPLATE_STAGES = 8
#: The templates every host has (a host builds one on its first use); a team template may not
#: take one of these names.
BUILTIN_TEMPLATE_NAMES = frozenset({"base", "python", "node", "code-interpreter", "full"})
#: A team template's name: lower-case letters, digits, ".", "_", "-" (unanchored, so that a
#: reference `name:3` can embed it).
TEMPLATE_NAME_BODY = r"[a-z0-9][a-z0-9._-]{0,62}"
TEMPLATE_NAME_PATTERN = rf"^{TEMPLATE_NAME_BODY}$"
#: The cwd of the code context E2B's room (server/compat/e2b) takes as a language's default:
#: E2B's interpreter runs in its user's home, and this spelling (not "/home/user") marks the
#: one context that is E2B's, so that one a caller makes in /home/user is never taken for it.
#: Here because the host needs it too: the code-interpreter template makes and warms that
#: context before its snapshot, and the host must not import the E2B room.
E2B_DEFAULT_CWD = "/home/user/."

# -- ids the server makes -----------------------------------------------------------------
# A prefix that says what it names, then 12 hex digits (48 random bits). Anything else is
# not an id of ours: a lookup answers 404 without asking the store.

_ID_HEX_BYTES = 6
SANDBOX_ID_PREFIX = "sbx-"
SNAPSHOT_ID_PREFIX = "snap-"
BUILD_ID_PREFIX = "tb-"
SANDBOX_ID_RE = re.compile(rf"^{SANDBOX_ID_PREFIX}[0-9a-f]{{12}}$")
SNAPSHOT_ID_RE = re.compile(rf"^{SNAPSHOT_ID_PREFIX}[0-9a-f]{{12}}$")
BUILD_ID_RE = re.compile(rf"^{BUILD_ID_PREFIX}[0-9a-f]{{12}}$")
VOLUME_ID_PREFIX = "vol-"
VOLUME_ID_RE = re.compile(rf"^{VOLUME_ID_PREFIX}[0-9a-f]{{12}}$")
VOLUME_BACKUP_ID_PREFIX = "vsnap-"
VOLUME_BACKUP_ID_RE = re.compile(rf"^{VOLUME_BACKUP_ID_PREFIX}[0-9a-f]{{12}}$")


def new_sandbox_id() -> str:
    return SANDBOX_ID_PREFIX + secrets.token_hex(_ID_HEX_BYTES)


def new_snapshot_id() -> str:
    return SNAPSHOT_ID_PREFIX + secrets.token_hex(_ID_HEX_BYTES)


def new_build_id() -> str:
    return BUILD_ID_PREFIX + secrets.token_hex(_ID_HEX_BYTES)


def new_volume_id() -> str:
    return VOLUME_ID_PREFIX + secrets.token_hex(_ID_HEX_BYTES)


def new_volume_backup_id() -> str:
    return VOLUME_BACKUP_ID_PREFIX + secrets.token_hex(_ID_HEX_BYTES)


def clone_volume_id(volume_id: str, sandbox_id: str) -> str:
    """The id of the copy of `volume_id` that sandbox `sandbox_id` gets when it is made from
    a fork or a snapshot: the host makes the copy, the server names it, and neither has to
    tell the other which id it took."""
    digest = hashlib.sha256(f"{volume_id}/{sandbox_id}".encode()).hexdigest()
    return VOLUME_ID_PREFIX + digest[:2 * _ID_HEX_BYTES]


# -- volumes ------------------------------------------------------------------------------

MIN_VOLUME_MB = 16
MAX_VOLUME_MB = 1 << 20
DEFAULT_VOLUME_MB = 1024
#: Volumes one sandbox may mount (every VM has this many volume slots: ADR 0027).
MAX_VOLUMES_PER_SANDBOX = 4
#: A volume's name within its team (like a template's).
VOLUME_NAME_PATTERN = rf"^{TEMPLATE_NAME_BODY}$"
#: A sandbox's name: letters (either case), digits, '.', '_', '-'; up to 63; never a
#: sandbox id's form (SANDBOX_ID_RE: checked apart), so an id or a name can be told apart.
SANDBOX_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"


# -- error codes --------------------------------------------------------------------------

ErrorCode = Literal[
    "bad_request", "unauthorized", "not_found", "conflict", "payload_too_large",
    "validation_error", "rate_limited", "internal", "unavailable", "timeout",
    "forbidden", "insufficient_storage", "bad_gateway", "template_building", "host_unavailable",
    "host_lost", "volume_in_use", "quota_exceeded",
]
ERROR_CODES: tuple[ErrorCode, ...] = get_args(ErrorCode)

#: The HTTP status each code is sent with (and stands for inside an event stream, where an
#: error has no status of its own). Two codes share 409: `template_building` is a conflict
#: the client may wait out; two share 503: `host_unavailable` says the sandbox's host is out
#: of reach (its sandboxes are not lost: retry once it is back).
ERROR_STATUS: dict[ErrorCode, int] = {
    "bad_request": 400, "unauthorized": 401, "forbidden": 403, "not_found": 404,
    "timeout": 408, "conflict": 409, "template_building": 409, "host_lost": 409,
    "volume_in_use": 409, "quota_exceeded": 429,
    "payload_too_large": 413,
    "validation_error": 422, "rate_limited": 429, "internal": 500, "bad_gateway": 502,
    "unavailable": 503, "host_unavailable": 503, "insufficient_storage": 507,
}
#: The code a bare status stands for (an error raised without a code, a reply without an
#: envelope): the inverse of `ERROR_STATUS`, where a bare 409 is a plain `conflict` and a
#: bare 503 plain `unavailable`.
STATUS_ERROR_CODE: dict[int, ErrorCode] = {
    status: code for code, status in ERROR_STATUS.items()
    if code not in ("template_building", "host_unavailable", "host_lost", "volume_in_use",
                    "quota_exceeded")}
