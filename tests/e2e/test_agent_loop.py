"""The loop agent builders run, through the public SDK against a live server:
create, write, exec, read the traceback, retry, read the result, kill."""

from __future__ import annotations

import pytest

from pandastack import AsyncSandbox, ConflictError, Sandbox
from tests.e2e.conftest import LiveServer
from tests.sdk_credentials import Credentials

pytestmark = [pytest.mark.vm, pytest.mark.e2e]

BROKEN = "import json\nprint(json.dumps({'answer': 6 * 7})\n"
FIXED = "import json\nprint(json.dumps({'answer': 6 * 7}))\nopen('/work/out.txt','w').write('ok')\n"


def test_sync_loop(live_server: LiveServer) -> None:
    creds: Credentials = {"api_url": live_server.api_url, "api_key": live_server.api_key}
    with Sandbox.create(template="base", ttl_seconds=300, **creds) as sbx:
        sbx.filesystem.write("/work/step.py", BROKEN)
        first = sbx.exec("python /work/step.py", timeout_seconds=60)
        assert first.exit_code == 1
        assert "SyntaxError" in first.stderr
        sbx.filesystem.write("/work/step.py", FIXED)
        second = sbx.exec("python /work/step.py", timeout_seconds=60)
        assert second.exit_code == 0, second.stderr
        assert second.stdout == '{"answer": 42}\n'
        assert sbx.filesystem.read("/work/out.txt") == b"ok"
        sandbox_id = sbx.id
    ended = Sandbox.connect(sandbox_id, **creds)
    assert ended.info.state == "killed"
    with pytest.raises(ConflictError):
        ended.exec("true")


async def test_async_loop_with_streaming(live_server: LiveServer) -> None:
    creds: Credentials = {"api_url": live_server.api_url, "api_key": live_server.api_key}
    seen: list[str] = []
    async with await AsyncSandbox.create(template="base", ttl_seconds=300, **creds) as sbx:
        await sbx.filesystem.write("/work/count.sh", "for i in 1 2 3; do echo line$i; done\n")
        result = await sbx.exec("sh /work/count.sh", on_stdout=seen.append)
        assert result.exit_code == 0
        assert "".join(seen) == "line1\nline2\nline3\n"
        assert result.stdout == "line1\nline2\nline3\n"
