"""How our sandbox states and template names read in E2B's API (docs/e2b.md has the table).

E2B knows two live states, `running` and `paused`; a sandbox that ended is not found. Every
live state of ours that holds no running VM reads as `paused`, because E2B's way back from
`paused` (connect, resume) is our way back from each of them (`wake`, `resume`, a restart or
a restore), and the SDK offers nothing else to do with such a sandbox."""

from __future__ import annotations

import time
from typing import Literal

from pandastack.rules import DEFAULT_TEMPLATE
from pandastack.server.sandboxes.lifecycle import TIMEOUT_ONLY
from pandastack.server.store import Sandbox
from pandastack.wire.sandboxes import ENDED_STATES

E2bState = Literal["running", "paused"]

#: ours -> E2B's. `starting` is listed as running: E2B's create answers only once it runs.
STATES: dict[str, E2bState] = {
    "starting": "running",
    "running": "running",
    "paused": "paused",        # vCPUs stopped in place: connect resumes them
    "hibernated": "paused",    # memory and processes on disk: connect wakes it
    "stopped": "paused",       # persistent, its VM ended: connect starts it again
    "host_lost": "paused",     # its host stopped: connect restores what it last saved
}
#: Ours that count as ended: E2B reads them as gone (404), as it does a killed sandbox.
GONE: frozenset[str] = ENDED_STATES

#: E2B's state -> ours, for the list's `state=` filter.
OURS: dict[E2bState, tuple[str, ...]] = {
    "running": tuple(s for s, e in STATES.items() if e == "running"),
    "paused": tuple(s for s, e in STATES.items() if e == "paused"),
}
ALL_OURS: frozenset[str] = frozenset(STATES) | GONE

#: E2B's public template names -> ours; any other name is looked up as it is (a built-in or
#: the team's template), and a snapshot id of the team creates from that snapshot.
TEMPLATES: dict[str, str] = {
    "base": DEFAULT_TEMPLATE,
    "code-interpreter-v1": "code-interpreter",
    "code-interpreter": "code-interpreter",
}
#: ours -> the name E2B's SDKs know it by (the `alias` of a sandbox).
ALIASES: dict[str, str] = {DEFAULT_TEMPLATE: "base", "code-interpreter": "code-interpreter-v1"}


def e2b_state(ours: str) -> E2bState:
    return STATES[ours]


def our_template(e2b_name: str) -> str:
    """E2B's template name (`base`, `code-interpreter-v1`, `name:tag`) as ours. E2B's tag
    `:latest` is our newest version, which a bare name already means."""
    name = e2b_name.removesuffix(":latest") if e2b_name.count(":") == 1 else e2b_name
    return TEMPLATES.get(name, name)


def alias_of(ours: str) -> str:
    name = ours.split(":", 1)[0]
    return ALIASES.get(name, name)


def past_timeout(row: Sandbox, now: float | None = None) -> bool:
    """Whether E2B reads `row` as ended by its timeout though the reaper has not yet ended
    it (it does on its next pass, within a second): E2B's sandbox is gone at its timeout,
    and E2B's own tests look right after it."""
    return (row.on_expiry == TIMEOUT_ONLY and not row.persistent
            and row.expires_at is not None
            and (time.time() if now is None else now) >= row.expires_at)
