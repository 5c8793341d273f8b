"""What `Sandbox.fork` and `AsyncSandbox.fork` return: the children, as a list, with what the
server measured of the fork."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from pandastack.wire.sandboxes import ForkResult

T = TypeVar("T")


class Forked(list[T]):
    """The children of a fork (a plain list of sandbox handles to iterate, index or unpack),
    and `duration_ms`: the fork on the server's side; `parent_pause_ms`: how long the
    parent's guest stood stopped for the fork's snapshot (None where the host does not say)."""

    def __init__(self, children: Iterable[T], result: ForkResult) -> None:
        super().__init__(children)
        self.duration_ms = result.duration_ms
        self.parent_pause_ms = result.parent_pause_ms
