"""Both agents' recursive watch tells each entry of a new directory once. When a directory
appears, the watch adds an inotify watch on it and then scans it (what was made before the
watch counts as created); an entry made between the two is both in the scan and in the
kernel's queue. The race that tests/host/agentlink/test_watch_client.py hit now and then
under load (a second `create d/f`) is made to happen every time: in the Python agent by
`Racing`, a Watcher that makes the entry right after adding the watch; in either agent's
process (the static binary has no seam to hook) by strace, which stops the agent on the
return of its inotify_add_watch of `d` while the test makes the entry."""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pandastack.guest.watch import Watcher
from tests.guest.test_agent_raw import Raw

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


STRACE = shutil.which("strace")
STOPPED = b"--- stopped by SIGSTOP ---"


def stopped_on_watching(d: Path, agent_cmd: list[str], trace: Path) -> list[str]:
    """`agent_cmd` under strace, which stops the agent (SIGSTOP, the whole process) right
    after its inotify_add_watch of `d` returns, and says so in the FIFO `trace`."""
    assert STRACE is not None
    return [STRACE, "-f", "-qq", "-o", str(trace), "-P", str(d),
            "-e", "trace=inotify_add_watch", "-e", "signal=SIGSTOP",
            "-e", "inject=inotify_add_watch:signal=SIGSTOP", *agent_cmd]


def wait_for_line(fd: int, wanted: bytes) -> None:
    got = b""
    deadline = time.monotonic() + WAIT_S
    while wanted not in got:
        left = deadline - time.monotonic()
        assert left > 0, f"strace never wrote {wanted!r}: {got!r}"
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 4096)
            assert chunk, f"strace ended without {wanted!r}: {got!r}"
            got += chunk


def events_until(raw: Raw, root: Path, last: tuple[str, str]) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    while last not in seen:
        f = raw.recv()  # bounded by the socket's timeout
        if f.id == 1 and f.t == "events":
            batch: list[dict[str, Any]] = json.loads(f.payload)
            seen += [(e["type"], str(Path(e["path"]).relative_to(root))) for e in batch]
        assert f.t != "eof", f"watch ended: {f.header}"
    return seen


@pytest.mark.skipif(STRACE is None, reason="strace is not installed (scripts/host-deps.sh)")
@pytest.mark.parametrize("remake", [False, True], ids=["made", "remade"])
def test_each_agent_tells_an_entry_made_between_its_watch_and_its_scan_once(
        agent_cmd: list[str], tmp_path: Path, remake: bool) -> None:
    root, trace = tmp_path / "root", tmp_path / "strace.fifo"
    root.mkdir()
    os.mkfifo(trace)
    # Opened before strace opens it to write, so that open does not wait for a reader.
    trace_fd = os.open(trace, os.O_RDONLY | os.O_NONBLOCK)
    raw = Raw(cmd=stopped_on_watching(root / "d", agent_cmd, trace))
    agent_pid = 0
    try:
        agent_pid = raw.hello().header["pid"]  # strace's child, not raw.proc
        raw.req("watch", 1, path=str(root), recursive=True)
        assert raw.recv_until(1, "watching")[-1].t == "watching"
        (root / "d").mkdir()
        wait_for_line(trace_fd, STOPPED)  # d is watched and not yet scanned
        (root / "d" / "f").touch()
        if remake:
            (root / "d" / "f").unlink()
            (root / "d" / "f").touch()
        os.kill(agent_pid, signal.SIGCONT)
        seen = events_until(raw, root, ("create", "d/f"))  # the scan's
        # Made after every event of d/f was queued: once it is told, so is everything before.
        (root / "last").touch()
        seen += events_until(raw, root, ("create", "last"))
        again = [("remove", "d/f"), ("create", "d/f")] if remake else []
        assert seen == [("create", "d"), ("create", "d/f"), *again, ("create", "last")]
        raw.req("cancel", 1)
    finally:
        if agent_pid:  # a failure above may leave it stopped, and then it never exits
            with contextlib.suppress(ProcessLookupError):
                os.kill(agent_pid, signal.SIGCONT)
        raw.close()
        os.close(trace_fd)
