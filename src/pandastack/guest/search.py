"""Searches in the guest's own walk (no shell, no subprocess): grep and glob.

Both walk a tree depth first with each directory's names in byte order, so what they answer
is sorted by path component by component, and truncation cuts the same place in both agents.
Symlinks are not followed into directories; unreadable directories are skipped. The static
agent (guest-agent/src/search.rs) answers the same: tests/guest/test_search_raw.py."""

from __future__ import annotations

import json
import os
import stat as st
from collections.abc import Callable, Iterator
from typing import Any

from pandastack.guestproto.frames import Frame
from pandastack.guestproto.ops import (
    GLOB_MAX_PATHS,
    GREP_BINARY_PROBE_BYTES,
    GREP_MAX_FILE_BYTES,
    GREP_MAX_LINE_BYTES,
    GREP_MAX_MATCHES,
    GREP_MAX_TOTAL_BYTES,
    SEARCH_MAX_ENTRIES,
    SEARCH_MAX_PATTERN_BYTES,
)

from .ops import Handler, Op, OpError, arg_bool, arg_str

Descend = Callable[[list[str]], bool]


def _pattern(h: dict[str, Any]) -> str:
    pattern = arg_str(h, "pattern")
    size = len(pattern.encode("utf-8", "surrogateescape"))
    if not pattern or size > SEARCH_MAX_PATTERN_BYTES:
        raise OpError("EINVAL", f"'pattern' must be 1..{SEARCH_MAX_PATTERN_BYTES} bytes")
    return pattern


def _join(parent: str, name: str) -> str:
    return parent + name if parent.endswith("/") else f"{parent}/{name}"


class _Walk:
    """(names relative to root, path) of everything under root, depth first, in order; at
    most SEARCH_MAX_ENTRIES entries read in all: the directory that would pass them ends
    the walk, `stopped`. (Counting what is read, not what is answered, bounds a glob whose
    pattern matches little in a huge tree, and the memory of one huge directory.)"""

    def __init__(self, op: Op, root: str, descend: Descend) -> None:
        self.op, self.root, self.descend = op, root, descend
        self.left = SEARCH_MAX_ENTRIES
        self.stopped = False

    def _children(self, path: str) -> list[tuple[str, bool]] | None:
        """(name, is a directory not reached through a symlink), in byte order of the
        names; [] when unreadable, None when the bound stops the walk here."""
        found: list[tuple[str, bool]] = []
        try:
            with os.scandir(path) as it:
                for e in it:
                    if len(found) == self.left:
                        self.stopped = True
                        return None
                    found.append((e.name, e.is_dir(follow_symlinks=False)))
        except OSError:
            return []
        self.left -= len(found)
        return sorted(found, key=lambda c: os.fsencode(c[0]))

    def __iter__(self) -> Iterator[tuple[list[str], str]]:
        stack: list[tuple[list[str], str, bool]] = []
        parts: list[str] = []
        path, is_dir = self.root, True
        while not self.op.cancelled.is_set():
            if is_dir and (not parts or self.descend(parts)):
                children = self._children(path)
                if children is None:
                    return
                stack.extend(([*parts, name], _join(path, name), sub)
                             for name, sub in reversed(children))
            if not stack:
                return
            parts, path, is_dir = stack.pop()
            yield parts, path


def _finish(op: Op, items: list[dict[str, object]] | list[str], truncated: bool) -> None:
    if op.cancelled.is_set():
        return
    body = json.dumps(items).encode()
    if op.send_data("data", body):
        op.send("eof", size=len(body), truncated=truncated)


# --- grep ---------------------------------------------------------------------------------


class _Grep:
    def __init__(self, needle: bytes, ignore_case: bool) -> None:
        self.needle = needle.lower() if ignore_case else needle
        self.ignore_case = ignore_case
        self.matches: list[dict[str, object]] = []
        self.read = 0
        self.truncated = False

    def file(self, path: str) -> bool:
        """Search one file; False once a bound stops the whole grep."""
        try:
            s = os.stat(path)
            # An empty file has nothing to find; /proc's files all say 0, and some block.
            if not st.S_ISREG(s.st_mode) or not 0 < s.st_size <= GREP_MAX_FILE_BYTES:
                return True
            if self.read + s.st_size > GREP_MAX_TOTAL_BYTES:
                self.truncated = True
                return False
            with open(path, "rb") as fh:
                data = fh.read(GREP_MAX_FILE_BYTES + 1)
        except OSError:
            return True
        self.read += len(data)
        if len(data) > GREP_MAX_FILE_BYTES or b"\0" in data[:GREP_BINARY_PROBE_BYTES]:
            return True
        return self._lines(path, data)

    def _lines(self, path: str, data: bytes) -> bool:
        hay = data.lower() if self.ignore_case else data
        start, line, counted = 0, 1, 0
        while (at := hay.find(self.needle, start)) >= 0:
            begin = hay.rfind(b"\n", 0, at) + 1
            end = hay.find(b"\n", at)
            end = len(hay) if end < 0 else end
            line += hay.count(b"\n", counted, begin)
            counted = begin
            if len(self.matches) == GREP_MAX_MATCHES:
                self.truncated = True
                return False
            text = data[begin:min(end, begin + GREP_MAX_LINE_BYTES)]
            self.matches.append({"path": path, "line": line,
                                 "text": text.decode("utf-8", "surrogateescape")})
            start = end + 1
        return True


def grep(op: Op, f: Frame) -> None:
    path = arg_str(f.header, "path")
    pattern = _pattern(f.header)
    if "\n" in pattern:
        raise OpError("EINVAL", "'pattern' must be one line")
    g = _Grep(pattern.encode("utf-8", "surrogateescape"), arg_bool(f.header, "ignore_case"))
    if st.S_ISDIR(os.stat(path).st_mode):
        walk = _Walk(op, path, lambda _: True)
        for _, sub in walk:
            if not g.file(sub):
                break
        g.truncated |= walk.stopped
    else:
        g.file(path)
    _finish(op, g.matches, g.truncated)


# --- glob ---------------------------------------------------------------------------------


def name_matches(pattern: str, name: str) -> bool:
    """`*` any run of characters, `?` one; every other character stands for itself."""
    p = n = 0
    star, mark = -1, 0
    while n < len(name):
        if p < len(pattern) and pattern[p] in ("?", name[n]):
            p, n = p + 1, n + 1
        elif p < len(pattern) and pattern[p] == "*":
            star, mark, p = p, n, p + 1
        elif star >= 0:
            p, mark = star + 1, mark + 1
            n = mark
        else:
            return False
    return pattern[p:].strip("*") == ""


def _closure(parts: list[str], states: set[int]) -> set[int]:
    """A `**` may match no name: its state also stands at the part after it."""
    out = set(states)
    for i in sorted(states):
        while i < len(parts) and parts[i] == "**":
            i += 1
            out.add(i)
    return out


def parts_match(parts: list[str], names: list[str], *, prefix: bool = False) -> bool:
    """Whether ``names`` match ``parts`` (or, with ``prefix``, may begin a match)."""
    states = _closure(parts, {0})
    for name in names:
        step = {i if parts[i] == "**" else i + 1 for i in states
                if i < len(parts) and (parts[i] == "**" or name_matches(parts[i], name))}
        states = _closure(parts, step)
        if not states:
            return False
    return any(i < len(parts) for i in states) if prefix else len(parts) in states


def split_pattern(pattern: str) -> list[str]:
    if pattern.startswith("/"):
        raise OpError("EINVAL", "'pattern' is relative to 'path'")
    parts: list[str] = []
    for part in pattern.split("/"):
        if part in ("", ".") or (part == "**" and parts[-1:] == ["**"]):
            continue
        parts.append(part)
    if not parts:
        raise OpError("EINVAL", "'pattern' names nothing")
    return parts


def glob(op: Op, f: Frame) -> None:
    path = arg_str(f.header, "path")
    parts = split_pattern(_pattern(f.header))
    if not st.S_ISDIR(os.stat(path).st_mode):
        raise OpError("ENOTDIR", "Not a directory", path)
    found: list[str] = []
    truncated = False
    walk = _Walk(op, path, lambda names: parts_match(parts, names, prefix=True))
    for names, sub in walk:
        if parts_match(parts, names):
            if len(found) == GLOB_MAX_PATHS:
                truncated = True
                break
            found.append(sub)
    _finish(op, found, truncated or walk.stopped)


#: The requests this module answers (the agent's dispatch table is made of these).
HANDLERS: dict[str, Handler] = {
    "grep": lambda a, op, f: grep(op, f),
    "glob": lambda a, op, f: glob(op, f),
}
