"""What one exec keeps of its output, over the in-memory host: the server's setting
(PANDASTACK_MAX_EXEC_OUTPUT_MB) is the default and the most a request's `max_output_bytes`
may ask for; more is 422 in the envelope before the host is asked. The host is told the
limit (exec) or to keep nothing (exec/stream, whose `exit` carries no output and whose
stream is cut at the limit instead). The real guest is in tests/e2e/test_exec_output_limit.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pandastack.rules import MAX_EXEC_OUTPUT_MB
from pandastack.server.settings import Settings
from tests.server.conftest import Api, assert_envelope, make_settings, running_app
from tests.server.fakes import FakeRuntime, FakeSandbox

LIMIT = 8
CMD = "echo hello world"
# What the fake host prints for CMD: the command and one invalid UTF-8 byte.
OUTPUT = CMD.encode() + b"\xff"


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[Api, FakeRuntime]]:
    runtime = FakeRuntime(tmp_path)
    settings = make_settings(tmp_path, max_exec_output_bytes=LIMIT)
    async with running_app(settings, runtime) as a:
        yield a, runtime


async def sandbox(api: Api, runtime: FakeRuntime) -> tuple[str, FakeSandbox]:
    r = await api.client.post("/v1/sandboxes", json={})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    return sid, runtime.sandboxes[sid]


def sse_events(text: str) -> list[tuple[str, dict[str, object]]]:
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        events.append((fields["event"], json.loads(fields["data"])))
    return events


async def test_exec_keeps_the_setting_or_less(api: tuple[Api, FakeRuntime]) -> None:
    app, runtime = api
    sid, sbx = await sandbox(app, runtime)
    r = await app.client.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": CMD})
    assert r.status_code == 200, r.text
    assert sbx.last_max_output == LIMIT
    assert r.json()["stdout"] == OUTPUT[:LIMIT].decode() and r.json()["truncated"] is True

    r = await app.client.post(f"/v1/sandboxes/{sid}/exec",
                              json={"cmd": CMD, "max_output_bytes": 4})
    assert r.status_code == 200, r.text
    assert sbx.last_max_output == 4
    assert r.json()["stdout"] == OUTPUT[:4].decode() and r.json()["truncated"] is True


@pytest.mark.parametrize("route", ["exec", "exec/stream"])
@pytest.mark.parametrize("value", [LIMIT + 1, (MAX_EXEC_OUTPUT_MB << 20) + 1, -1])
async def test_over_the_limit_is_422_in_the_envelope(api: tuple[Api, FakeRuntime], route: str,
                                                     value: int) -> None:
    app, runtime = api
    sid, sbx = await sandbox(app, runtime)
    r = await app.client.post(f"/v1/sandboxes/{sid}/{route}",
                              json={"cmd": CMD, "max_output_bytes": value})
    assert_envelope(r, 422, "validation_error")
    assert "max_output_bytes" in r.json()["error"]["message"]
    assert sbx.last_max_output is None  # the host was never asked


async def test_stream_sends_at_most_the_limit(api: tuple[Api, FakeRuntime]) -> None:
    app, runtime = api
    sid, sbx = await sandbox(app, runtime)
    for cmd, asked, sent in ((CMD, None, LIMIT), (CMD, 4, 4), ("hi", None, 3)):
        body: dict[str, object] = {"cmd": cmd}
        if asked is not None:
            body["max_output_bytes"] = asked
        r = await app.client.post(f"/v1/sandboxes/{sid}/exec/stream", json=body)
        assert r.status_code == 200, r.text
        events = sse_events(r.text)
        out = "".join(str(data["data"]) for name, data in events if name == "stdout")
        printed = cmd.encode() + b"\xff"
        assert out == printed[:sent].decode("utf-8", "replace")
        assert events[-1][0] == "exit"
        assert events[-1][1]["truncated"] is (sent < len(printed))
        assert sbx.last_max_output == 0  # nothing kept for a result that carries none


@pytest.mark.parametrize("raw", ["0", "-3", str(MAX_EXEC_OUTPUT_MB + 1), "x"])
def test_setting_is_validated(raw: str) -> None:
    with pytest.raises(ValueError, match="MAX_EXEC_OUTPUT_MB"):
        Settings.from_env({"PANDASTACK_MAX_EXEC_OUTPUT_MB": raw})


def test_setting_in_mib() -> None:
    settings = Settings.from_env({"PANDASTACK_MAX_EXEC_OUTPUT_MB": "3"})
    assert settings.max_exec_output_bytes == 3 << 20
    assert Settings.from_env({}).max_exec_output_bytes == 64 << 20
