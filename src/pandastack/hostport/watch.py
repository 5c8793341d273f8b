"""File watching on the host port (ADR 0029): the events a watch yields and their wire form
on the host API (EVENT frames of a `host_api.models.WatchBatch` each, then a RESULT frame saying
why it ended).

A watch yields `watching` once it is set up (so a caller knows that what happens from then
on is seen), then `create`, `write`, `remove`, `rename` (with `old_path`) and `chmod` events
in the order the guest saw them, and ends with `overflow` (events were lost: list again and
watch anew) or when the watched directory went away (the iterator just ends).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

EVENT_TYPES = frozenset({"create", "write", "remove", "rename", "chmod"})
WatchEventType = Literal["watching", "create", "write", "remove", "rename", "chmod",
                         "overflow"]


@dataclass(frozen=True)
class WatchEvent:
    type: str
    path: str
    old_path: str | None = None  # rename: where it was
    is_dir: bool = False
