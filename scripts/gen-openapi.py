#!/usr/bin/env python3
"""Write the server's OpenAPI document to spec/openapi.json (or check it with --check)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pandastack.server.app import create_app
from pandastack.server.settings import Settings

SPEC = Path(__file__).resolve().parent.parent / "spec" / "openapi.json"


def render() -> str:
    return json.dumps(create_app(Settings()).openapi(), indent=2, sort_keys=True) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the file is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not SPEC.exists() or SPEC.read_text() != text:
            print(f"{SPEC} is stale: run scripts/gen-openapi.py", file=sys.stderr)
            return 1
        return 0
    SPEC.parent.mkdir(parents=True, exist_ok=True)
    SPEC.write_text(text)
    print(f"wrote {SPEC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
