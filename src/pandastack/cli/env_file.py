"""`--env-file`: the units' env file (/etc/pandastack/pandastack.env) read by the commands an
operator runs beside them (doctor, backup, restore), as systemd's EnvironmentFile reads it.
Sourcing it in a shell (`set -a; . FILE`) breaks on a value with spaces, as the unquoted
PANDASTACK_AGENT_ARGS may have."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def add_env_file_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env-file", type=Path, default=None, metavar="PATH",
                   help="read settings from this env file first, as the units do "
                        "(/etc/pandastack/pandastack.env); the environment's own win")


def load_env_file(path: Path | None) -> None:
    if path is not None:
        for key, value in read_env_file(path).items():
            os.environ.setdefault(key, value)


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as systemd's EnvironmentFile reads them: comments and blank lines
    skipped, one pair of surrounding quotes removed."""
    values: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key.replace("_", "").isalnum():
            raise ValueError(f"{path}:{number}: expected KEY=VALUE, not {raw!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[key] = value
    return values
