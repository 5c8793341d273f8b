"""`python -m tests.server.serve_logged PORT DIR [SETTINGS_JSON]`: the app over the
in-memory runtime, served as `pandastack serve` serves it (cli/serve.py: the same uvicorn
call, access log on, level info), with its DB and client config under DIR. For tests that
read what the server logs."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from pandastack.cli.serve import serve_app
from pandastack.server.app import create_app
from tests.server.conftest import make_settings
from tests.server.fakes import FakeRuntime


def main(argv: list[str]) -> int:
    port, tmp = int(argv[0]), Path(argv[1])
    overrides: dict[str, object] = json.loads(argv[2]) if len(argv) > 2 else {}
    settings = make_settings(tmp, port=port, **overrides)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve_app(create_app(settings, FakeRuntime(tmp / "sandboxes")), settings, "info")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
