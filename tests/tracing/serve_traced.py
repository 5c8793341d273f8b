"""`python -m tests.tracing.serve_traced PORT DIR SETTINGS_JSON`: the API server as
`pandastack serve` runs it (`serve_app`: spans exported where the standard OTEL_* variables
say), over the agent the settings name; for tests.server.live.fake_server."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pandastack.cli.serve import serve_app
from pandastack.server.app import create_app
from tests.server.conftest import make_settings


def main(argv: list[str]) -> int:
    port, tmp = int(argv[0]), Path(argv[1])
    overrides: dict[str, object] = json.loads(argv[2]) if len(argv) > 2 else {}
    if "agent_token_file" in overrides:  # a path, which JSON carries as a string
        overrides["agent_token_file"] = Path(str(overrides["agent_token_file"]))
    settings = make_settings(tmp, port=port, **overrides)
    serve_app(create_app(settings), settings, "warning", access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
