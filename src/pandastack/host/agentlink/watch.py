"""`watch` of `AgentClient`: a directory's file events as the guest's inotify sees them
(spec/guest-protocol.md "watch", docs/adr/0029-file-watch.md).

The guest sends its events as `events` frames that count against the op's credit window like
file data, and the window is granted back only as the caller takes the batches: a caller
that stops reading stops the guest's sending (its own bounded queue then ends the watch in
`overflow`), so the host never holds more than the window for a watch."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from pandastack.guestproto import frames as P
from pandastack.host.agentlink.channel import AgentChannel
from pandastack.hostport.watch import EVENT_TYPES, WatchEvent

MAX_PATH = 16 * 1024
"""Characters of a path in an event (PATH_MAX is 4096 bytes; escapes may make it longer)."""


class WatchOps(AgentChannel):
    async def watch(self, path: str, *,
                    recursive: bool = True) -> AsyncGenerator[list[WatchEvent], None]:
        """Batches of events: first `[watching]` once the guest has set the watch up, the
        last `[overflow]` if the guest dropped events. Ends when the watched directory is
        gone; runs until closed otherwise (``aclose()`` it to stop the watch)."""
        with self._operation("watch") as op:
            await self._request(op, {"path": path, "recursive": recursive})
            f = await self._next(op, self.op_timeout)
            if f.t != "watching":
                raise self._protocol_error(f"watch: expected 'watching', got {f.t!r}")
            root = self._field(f, "path", str)
            yield [WatchEvent("watching", root)]
            while True:
                f = await self._next(op, None)
                if f.t == "events":
                    batch = [self._event(d) for d in self._json_list(f, "watch")]
                    yield batch
                    # The guest paid at least WATCH_FRAME_CREDIT for the frame; the channel
                    # counted its payload: count the rest too, then grant all of it back.
                    cost = max(len(f.payload), P.WATCH_FRAME_CREDIT)
                    op.recv_window -= cost - len(f.payload)
                    await self._consumed(op, cost)
                elif f.t == "eof":
                    op.finished = True
                    if f.header.get("reason") == "overflow":
                        yield [WatchEvent("overflow", root)]
                    return
                else:
                    raise self._protocol_error(f"watch: unexpected {f.t!r} frame")

    def _event(self, d: Any) -> WatchEvent:
        if not isinstance(d, dict):
            raise self._protocol_error("watch: an event is not an object")
        kind, path, old, is_dir = d.get("type"), d.get("path"), d.get("old_path"), d.get("is_dir")
        if (kind not in EVENT_TYPES or not isinstance(path, str) or len(path) > MAX_PATH
                or not isinstance(is_dir, bool)
                or (kind == "rename") != isinstance(old, str)
                or (isinstance(old, str) and len(old) > MAX_PATH)):
            raise self._protocol_error(f"watch: bad event {str(d)[:200]}")
        return WatchEvent(str(kind), path, old if isinstance(old, str) else None, is_dir)
