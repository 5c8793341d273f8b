"""The Python agent's recursive watch tells each entry of a new directory once. When a
directory appears, the watch adds an inotify watch on it and then scans it (what was made
before the watch counts as created); an entry made between the two is both in the scan and
in the kernel's queue. `Racing` makes one exactly there, so the race that
tests/host/agentlink/test_watch_client.py hit now and then under load (a second
`create d/f`) happens every time."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pandastack.guest.watch import Watcher

WAIT_S = 20.0


class Racing(Watcher):
    """Makes `d/f` right after the watch on a directory named `d` is added (and, with
    `remake`, removes it and makes it again there)."""

    remake = False

    def _add_one(self, path: str) -> bool:
        added = super()._add_one(path)
        if Path(path).name == "d":
            (Path(path) / "f").touch()
            if self.remake:
                (Path(path) / "f").unlink()
                (Path(path) / "f").touch()
        return added


@pytest.fixture(params=[False, True], ids=["made", "remade"])
def watcher(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Racing]:
    w = Racing(str(tmp_path), recursive=True)
    w.remake = request.param
    reader = threading.Thread(target=w.run, daemon=True)
    reader.start()
    try:
        yield w
    finally:
        w.stop()
        reader.join(5)
        w.close()


def told_until(w: Watcher, root: Path, last: tuple[str, str]) -> list[tuple[str, str]]:
    """What the watch told, up to and including `last` (and what came in its batch)."""
    seen: list[tuple[str, str]] = []
    deadline = time.monotonic() + WAIT_S
    while last not in seen:
        assert time.monotonic() < deadline, f"no {last}: {seen}"
        with w.cond:
            events = list(w.queue)
            w.queue.clear()
        seen += [(e["type"], str(Path(e["path"]).relative_to(root))) for e in events]
        time.sleep(0.01)
    return seen


def test_an_entry_made_between_the_watch_and_the_scan_is_told_as_it_happened(
        watcher: Racing, tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    seen = told_until(watcher, tmp_path, ("create", "d/f"))  # the scan's
    # Made after every event of d/f was queued: once it is told, so is everything before it.
    (tmp_path / "last").touch()
    seen += told_until(watcher, tmp_path, ("create", "last"))
    # Made once: one create. Made, removed and made again: the scan sees the last one and
    # the queue all three, of which only the first is the scan's.
    again = [("remove", "d/f"), ("create", "d/f")] if watcher.remake else []
    assert seen == [("create", "d"), ("create", "d/f"), *again, ("create", "last")]
