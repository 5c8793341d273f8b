"""File watching on the host port (ADR 0029): the events a watch yields and their wire form
on the host API (EVENT frames of a JSON list each, then a RESULT frame saying why it ended).

A watch yields `watching` once it is set up (so a caller knows that what happens from then
on is seen), then `create`, `write`, `remove`, `rename` (with `old_path`) and `chmod` events
in the order the guest saw them, and ends with `overflow` (events were lost: list again and
watch anew) or when the watched directory went away (the iterator just ends).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pandastack.wire.base import Strict

EVENT_TYPES = frozenset({"create", "write", "remove", "rename", "chmod"})
WatchEventType = Literal["watching", "create", "write", "remove", "rename", "chmod",
                         "overflow"]


@dataclass(frozen=True)
class WatchEvent:
    type: str
    path: str
    old_path: str | None = None  # rename: where it was
    is_dir: bool = False


class WatchEventModel(Strict):
    type: WatchEventType
    path: str
    old_path: str | None = None
    is_dir: bool = False

    @classmethod
    def of(cls, event: WatchEvent) -> WatchEventModel:
        return cls.model_validate({"type": event.type, "path": event.path,
                                   "old_path": event.old_path, "is_dir": event.is_dir})

    def event(self) -> WatchEvent:
        return WatchEvent(self.type, self.path, self.old_path, self.is_dir)


class WatchBatch(Strict):
    """One EVENT frame of a host API watch stream."""

    events: list[WatchEventModel]


class WatchDone(Strict):
    """The final RESULT frame of a watch: why it ended ("overflow" came as an event
    before it)."""

    reason: str
