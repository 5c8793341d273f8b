"""`python -m tests.server.serve_fake PORT DIR [SETTINGS_JSON]`: the app over the in-memory
runtime on a real uvicorn at 127.0.0.1:PORT (and its preview listener), with its DB and
client config under DIR. For
tests that need a real HTTP server in a process of its own (memory, sockets, restarts)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pandastack.cli.serve import serve_app
from pandastack.server.app import create_app
from tests.server.conftest import make_settings
from tests.server.fakes import FakeRuntime, ScriptedBuilder


def main(argv: list[str]) -> int:
    port, tmp = int(argv[0]), Path(argv[1])
    overrides: dict[str, object] = json.loads(argv[2]) if len(argv) > 2 else {}
    runtime = FakeRuntime(tmp / "sandboxes")
    runtime.ns_ip = overrides.pop("fake_ns_ip", None)  # type: ignore[assignment]
    settings = make_settings(tmp, port=port, **overrides)
    runtime.builder = ScriptedBuilder(runtime)
    app = create_app(settings, runtime)
    # As `serve` runs it: the API and the preview listener (settings' preview_port).
    serve_app(app, settings, "warning", access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
