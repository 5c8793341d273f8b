"""The real S3 server of the tests (scripts/s3-server: OpenStack Swift with s3api), started
once per session. A server that does not start fails the tests that need it with its log
tail; they never skip."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.leftovers import owned_tmpdir

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "s3-server"


def parse_env(text: str) -> dict[str, str]:
    env = {}
    for line in text.splitlines():
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = shlex.split(value)[0] if value else ""
    return env


@contextmanager
def s3_server() -> Iterator[dict[str, str]]:
    """Starts a private server, yields its environment (PANDASTACK_S3_ENDPOINT, ...), stops
    it and removes its directory."""
    # Under /tmp: as root the servers run as the swift user, who must reach the directory.
    directory = owned_tmpdir("pandastack-s3-")
    try:
        started = subprocess.run([str(SCRIPT), "start", str(directory)], capture_output=True,
                                 text=True, timeout=300)
        if started.returncode != 0:
            pytest.fail(f"the S3 server did not start ({SCRIPT} start {directory}, exit "
                        f"{started.returncode}):\n{started.stderr[-6000:]}", pytrace=False)
        yield parse_env(started.stdout)
    finally:
        subprocess.run([str(SCRIPT), "stop", str(directory)], capture_output=True, timeout=60)
