"""`grep` and `glob` through raw frames, run by both agents (``agent_cmd``) on one tree made
here: each case holds both to the same literal answer, so they answer alike."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pandastack.guest.search import name_matches, parts_match, split_pattern
from pandastack.guestproto.ops import (
    GLOB_MAX_PATHS,
    GREP_MAX_FILE_BYTES,
    GREP_MAX_LINE_BYTES,
    GREP_MAX_MATCHES,
    SEARCH_MAX_ENTRIES,
    SEARCH_MAX_PATTERN_BYTES,
)
from tests.guest.test_agent_raw import Raw

pytestmark = pytest.mark.timeout(60)


def ask(cmd: list[str], t: str, **fields: Any) -> tuple[Any, bool]:
    """(the decoded answer, truncated); an `error` reply as ("error", code, path)."""
    r = Raw(cmd=cmd)
    try:
        r.hello()
        r.req(t, 1, **fields)
        frames = r.recv_until(1, "eof")
    finally:
        r.close()
    last = frames[-1].header
    if last["t"] == "error":
        return ("error", last["code"], last.get("path")), False
    body = b"".join(f.payload for f in frames if f.t == "data")
    assert [f.t for f in frames] == ["data"] * (len(frames) - 1) + ["eof"]
    assert last["size"] == len(body)
    return json.loads(body), last["truncated"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("search")
    (root / "a").mkdir()
    (root / "a" / "b.txt").write_bytes(b"say hello\n")
    (root / "a.txt").write_bytes(b"hello world\nno\nHELLO again\nhello")
    (root / "bin.dat").write_bytes(b"hello\0binary\n")
    (root / "big.txt").write_bytes(b"hello\n" + b"x" * GREP_MAX_FILE_BYTES)
    (root / "long.txt").write_bytes(b"x" * 2000 + b"hello\n")
    (root / "link_dir").symlink_to(root / "a")
    (root / "link_file").symlink_to(root / "a.txt")
    (root / "sub" / "deep").mkdir(parents=True)
    for name in (".hidden.py", "y.py", "deep/x.py", "deep/x.pyc"):
        (root / "sub" / name).write_bytes(b"")
    os.mkfifo(root / "sub" / "fifo")  # opened, it would block the walk
    (root / os.fsdecode(b"n\xffm.txt")).write_bytes(b"\xfe hello \xc3\n")
    return root


def match(path: Path | str, line: int, text: str) -> dict[str, object]:
    return {"path": str(path), "line": line, "text": text}


def test_grep_walks_sorted_skipping_binary_big_and_symlinked_dirs(agent_cmd: list[str],
                                                                   tree: Path) -> None:
    got, truncated = ask(agent_cmd, "grep", path=str(tree), pattern="hello")
    assert got == [
        match(tree / "a" / "b.txt", 1, "say hello"),
        match(tree / "a.txt", 1, "hello world"),
        match(tree / "a.txt", 4, "hello"),
        match(tree / "link_file", 1, "hello world"),
        match(tree / "link_file", 4, "hello"),
        match(tree / "long.txt", 1, "x" * GREP_MAX_LINE_BYTES),
        # Bytes that are not UTF-8 come as the protocol's \udcXX escapes (§5 list).
        match(str(tree) + "/n\udcffm.txt", 1, "\udcfe hello \udcc3"),
    ]
    assert truncated is False


def test_grep_ignore_case_folds_ascii(agent_cmd: list[str], tree: Path) -> None:
    got, _ = ask(agent_cmd, "grep", path=str(tree / "a.txt"), pattern="hElLo", ignore_case=True)
    assert [m["line"] for m in got] == [1, 3, 4]
    assert ask(agent_cmd, "grep", path=str(tree / "a.txt"), pattern="hElLo")[0] == []


def test_grep_stops_at_the_match_bound(agent_cmd: list[str], tmp_path: Path) -> None:
    (tmp_path / "many").write_bytes(b"hit\n" * (GREP_MAX_MATCHES + 1))
    got, truncated = ask(agent_cmd, "grep", path=str(tmp_path), pattern="hit")
    assert len(got) == GREP_MAX_MATCHES and truncated is True
    assert got[-1] == match(tmp_path / "many", GREP_MAX_MATCHES, "hit")


@pytest.mark.parametrize(("op", "fields", "code"), [
    ("grep", {"pattern": "x" * (SEARCH_MAX_PATTERN_BYTES + 1)}, "EINVAL"),
    ("grep", {"pattern": "é" * (SEARCH_MAX_PATTERN_BYTES // 2 + 1)}, "EINVAL"),
    ("grep", {"pattern": ""}, "EINVAL"),
    ("grep", {"pattern": "a\nb"}, "EINVAL"),
    ("grep", {"pattern": "x", "ignore_case": 1}, "EINVAL"),
    ("glob", {"pattern": "x" * (SEARCH_MAX_PATTERN_BYTES + 1)}, "EINVAL"),
    ("glob", {"pattern": "/etc/*"}, "EINVAL"),
    ("glob", {"pattern": "./"}, "EINVAL"),
])
def test_bad_patterns_are_einval(agent_cmd: list[str], tree: Path, op: str,
                                 fields: dict[str, Any], code: str) -> None:
    got, _ = ask(agent_cmd, op, path=str(tree), **fields)
    assert got[:2] == ("error", code)


@pytest.mark.parametrize("op", ["grep", "glob"])
def test_a_missing_path_is_enoent_naming_it(agent_cmd: list[str], tree: Path, op: str) -> None:
    missing = str(tree / "nope")
    assert ask(agent_cmd, op, path=missing, pattern="x")[0] == ("error", "ENOENT", missing)


def test_a_pattern_at_the_bound_is_taken(agent_cmd: list[str], tree: Path) -> None:
    assert ask(agent_cmd, "grep", path=str(tree), pattern="y" * SEARCH_MAX_PATTERN_BYTES
               ) == ([], False)


@pytest.mark.parametrize(("pattern", "expected"), [
    ("**/*.py", ["sub/.hidden.py", "sub/deep/x.py", "sub/y.py"]),
    ("*.txt", ["a.txt", "big.txt", "long.txt", "n\udcffm.txt"]),
    ("?.txt", ["a.txt"]),
    ("a/*", ["a/b.txt"]),
    ("link_dir/*", []),
    ("sub/**", ["sub", "sub/.hidden.py", "sub/deep", "sub/deep/x.py", "sub/deep/x.pyc",
                "sub/fifo", "sub/y.py"]),
    ("sub/**/**/x.py*", ["sub/deep/x.py", "sub/deep/x.pyc"]),
    ("./sub//deep/*c", ["sub/deep/x.pyc"]),
    ("l*", ["link_dir", "link_file", "long.txt"]),
])
def test_glob_answers_sorted_paths_under_path(agent_cmd: list[str], tree: Path, pattern: str,
                                              expected: list[str]) -> None:
    got, truncated = ask(agent_cmd, "glob", path=str(tree) + "/", pattern=pattern)
    assert got == [str(tree) + "/" + p for p in expected] and truncated is False


def test_glob_of_a_file_is_enotdir(agent_cmd: list[str], tree: Path) -> None:
    path = str(tree / "a.txt")
    assert ask(agent_cmd, "glob", path=path, pattern="*")[0] == ("error", "ENOTDIR", path)


def test_glob_stops_at_the_path_bound(agent_cmd: list[str],
                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("many")
    for i in range(GLOB_MAX_PATHS + 1):
        (root / f"{i:05}").touch()
    got, truncated = ask(agent_cmd, "glob", path=str(root), pattern="*")
    assert truncated is True and len(got) == GLOB_MAX_PATHS
    assert got[-1] == f"{root}/{GLOB_MAX_PATHS - 1:05}"


@pytest.fixture(scope="module")
def huge() -> Iterator[Path]:
    """A tree of more than SEARCH_MAX_ENTRIES entries, all empty files but one (in tmpfs
    where there is one: 100 000 creates on a disk take seconds)."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    root = Path(tempfile.mkdtemp(prefix="huge-", dir=base))
    try:
        per_dir = SEARCH_MAX_ENTRIES // 100
        for d in range(101):
            (root / f"d{d:03}").mkdir()
            for i in range(per_dir):
                os.mknod(root / f"d{d:03}" / f"{i:05}")
        (root / "d000" / "x.txt").write_bytes(b"a needle\n")
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_walk_stops_at_the_entry_bound_though_little_matches(agent_cmd: list[str],
                                                                huge: Path) -> None:
    """A glob matching one path, and a grep finding one line, in a tree too big to walk:
    each answers what it found before the bound, truncated."""
    x = str(huge / "d000" / "x.txt")
    assert ask(agent_cmd, "glob", path=str(huge), pattern="**/x.txt") == ([x], True)
    assert ask(agent_cmd, "grep", path=str(huge), pattern="needle") == (
        [match(x, 1, "a needle")], True)
    # One directory of the tree is well within the bound.
    assert ask(agent_cmd, "glob", path=str(huge / "d000"), pattern="x.*") == ([x], False)
    # A pattern that prunes the walk reads only what it enters.
    assert ask(agent_cmd, "glob", path=str(huge), pattern="d000/x.txt") == ([x], False)


# --- the reference agent's matcher (the static agent's is held to it through the cases above)


@pytest.mark.parametrize(("pattern", "name", "ok"), [
    ("*", "", True), ("*", ".x", True), ("a*b", "aXXb", True), ("a*b", "aXXbc", False),
    ("?", "é", True), ("??", "é", False), ("*.*.*", "a.b", False), ("[ab]", "a", False),
    ("[ab]", "[ab]", True), ("a**", "abc", True),
])
def test_name_matches(pattern: str, name: str, ok: bool) -> None:
    assert name_matches(pattern, name) is ok


def test_globstar_matches_any_number_of_names_and_prunes_the_walk() -> None:
    parts = split_pattern("a/**/b")
    assert parts_match(parts, ["a", "b"]) and parts_match(parts, ["a", "x", "y", "b"])
    assert not parts_match(parts, ["a"]) and not parts_match(parts, ["b"])
    assert parts_match(parts, ["a", "x"], prefix=True)
    assert not parts_match(parts, ["c"], prefix=True)
    assert not parts_match(split_pattern("a/b"), ["a", "b"], prefix=True)
    assert split_pattern("**/**/x") == ["**", "x"]


@pytest.mark.parametrize(("pattern", "lines"), [("aab", [1]), ("abab", [2, 3]), ("bb", [])])
def test_grep_finds_overlapping_prefixes(agent_cmd: list[str], tmp_path: Path, pattern: str,
                                          lines: list[int]) -> None:
    (tmp_path / "f").write_bytes(b"aaab\nabab\nababab\n\n")
    got, _ = ask(agent_cmd, "grep", path=str(tmp_path / "f"), pattern=pattern)
    assert [m["line"] for m in got] == lines


def test_grep_skips_empty_files_so_proc_cannot_block_it(agent_cmd: list[str]) -> None:
    # /proc/kmsg says size 0 and a read of it waits for the kernel's next message.
    assert ask(agent_cmd, "grep", path="/proc/kmsg", pattern="x") == ([], False)
