"""Write the host API's OpenAPI document to spec/host-openapi.json, or check that it is
current: `python -m pandastack.host.api.spec [--check]` (from the repository's root)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import cast

from pandastack.hostport.protocols import RuntimePort

from .app import create_host_app

SPEC = Path("spec") / "host-openapi.json"


def render() -> str:
    # The document describes the routes only; no host is asked anything.
    app = create_host_app(cast(RuntimePort, object()), "unused")
    return json.dumps(app.openapi(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the file is stale")
    parser.add_argument("--path", type=Path, default=SPEC)
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not args.path.exists() or args.path.read_text() != text:
            print(f"{args.path} is stale: run python -m pandastack.host.api.spec",
                  file=sys.stderr)
            return 1
        return 0
    args.path.parent.mkdir(parents=True, exist_ok=True)
    args.path.write_text(text)
    print(f"wrote {args.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
