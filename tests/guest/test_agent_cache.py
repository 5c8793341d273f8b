"""The binary agent's build cache (scripts/build-guest-agent.sh) keeps the newest few builds:
every source change is a new entry, and without pruning they piled up for ever.

A stand-in rustc (RUSTC) makes each "compiler version" a new cache key, so these run in
milliseconds and need no toolchain; the real build is tests/guest/conftest.py's."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.guest.conftest import BUILD_SCRIPT

KEEP = 3

FAKE_RUSTC = """#!/bin/sh
if [ "$1" = -vV ]; then echo "rustc $FAKE_VERSION (stand-in)"; exit 0; fi
while [ $# -gt 1 ]; do
  if [ "$1" = -o ]; then printf 'agent %s\\n' "$FAKE_VERSION" >"$2"; chmod +x "$2"; fi
  shift
done
"""


@pytest.fixture
def build(tmp_path: Path) -> Callable[[str], Path]:
    """Runs the build script for a compiler version; returns the cache entry it printed."""
    rustc = tmp_path / "rustc"
    rustc.write_text(FAKE_RUSTC)
    rustc.chmod(0o755)
    cache = tmp_path / "cache"

    def run(version: str) -> Path:
        env = {**os.environ, "RUSTC": str(rustc), "FAKE_VERSION": version,
               "PANDASTACK_AGENT_CACHE": str(cache)}
        out = subprocess.run([str(BUILD_SCRIPT)], env=env, capture_output=True, text=True,
                             check=True, timeout=60)
        path = Path(out.stdout.strip().splitlines()[-1])
        assert path.read_text() == f"agent {version}\n"
        return path.parent

    return run


def entries(cache: Path) -> set[str]:
    return {p.name for p in cache.iterdir() if not p.name.startswith(".")}


def age(entry: Path, seconds: float) -> None:
    t = entry.stat().st_mtime - seconds
    os.utime(entry, (t, t))


def test_only_the_newest_builds_stay(build: Callable[[str], Path]) -> None:
    made = [build("v0")]
    cache = made[0].parent
    in_progress = cache / ".tmp-another-build"  # another build's, however old: not an entry
    in_progress.mkdir()
    age(in_progress, 10_000)
    made += [build(f"v{n}") for n in range(1, 6)]
    assert entries(cache) == {p.name for p in made[-KEEP:]}
    assert in_progress.is_dir()
    # Newest by mtime, not by build order: an entry used again (a cache hit) counts as new.
    for n, p in enumerate(made[-KEEP:]):
        age(p, 1000 - n)
    assert build("v3") == made[3]  # the oldest left, touched by its hit
    newest = build("v6")
    assert entries(cache) == {made[3].name, made[5].name, newest.name}


def test_the_build_just_made_stays_whatever_the_clock_says(build: Callable[[str], Path]) -> None:
    made = [build(f"v{n}") for n in range(KEEP)]
    for p in made:  # a clock that went back (or entries from the future): all look newer
        age(p, -10_000)
    new = build("now")
    assert new.is_dir()
    assert entries(new.parent) == {new.name, made[1].name, made[2].name}

