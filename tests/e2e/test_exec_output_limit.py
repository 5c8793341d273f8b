"""A real guest printing more than an exec may keep, over both host paths (the runtime in the
server's process, and a `pandastack agent` process): the result holds exactly the limit of
each stream and says `truncated`, the stream sends exactly the limit, the server's setting
is the default, and what the server holds while the output goes by stays far below it."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import AsyncIterator

import pytest

from tests.server.conftest import HOST_MODES, Api
from tests.server.vm_app import vm_app

pytestmark = [pytest.mark.vm, pytest.mark.timeout(900)]

# The server's own limit (PANDASTACK_MAX_EXEC_OUTPUT_MB is in MiB; the setting is bytes).
SETTING = 64 << 10
SMALL = 1000


def printing(count: int, char: str = "a", fd: int = 1) -> str:
    """A command that writes `count` copies of `char` to `fd` in the guest."""
    return f"head -c {count} /dev/zero | tr '\\0' '{char}' >&{fd}"


@pytest.fixture(scope="module", params=HOST_MODES)
async def api(request: pytest.FixtureRequest) -> AsyncIterator[Api]:
    async with vm_app(request.param, max_exec_output_bytes=SETTING) as a:
        yield a
        for row in (await a.client.get("/v1/sandboxes")).json()["sandboxes"]:
            await a.client.delete(f"/v1/sandboxes/{row['id']}")


@pytest.fixture(scope="module")
async def sid(api: Api) -> str:
    r = await api.client.post("/v1/sandboxes", json={"ttl_seconds": 900})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def run(api: Api, sid: str, cmd: str, **body: object) -> dict[str, object]:
    r = await api.client.post(f"/v1/sandboxes/{sid}/exec",
                              json={"cmd": cmd, "timeout_seconds": 300, **body})
    assert r.status_code == 200, r.text
    result: dict[str, object] = r.json()
    assert result["exit_code"] == 0, result
    return result


async def test_exactly_the_asked_limit_of_each_stream(api: Api, sid: str) -> None:
    cmd = f"{printing(3 * SMALL)}; {printing(5 * SMALL, 'e', 2)}"
    result = await run(api, sid, cmd, max_output_bytes=SMALL)
    assert result["stdout"] == "a" * SMALL
    assert result["stderr"] == "e" * SMALL
    assert result["truncated"] is True

    result = await run(api, sid, cmd, max_output_bytes=5 * SMALL)
    assert result["stdout"] == "a" * 3 * SMALL and result["stderr"] == "e" * 5 * SMALL
    assert result["truncated"] is False


async def test_the_setting_is_the_default(api: Api, sid: str) -> None:
    result = await run(api, sid, printing(3 * SETTING))
    assert result["stdout"] == "a" * SETTING and result["truncated"] is True
    result = await run(api, sid, printing(SETTING))
    assert result["stdout"] == "a" * SETTING and result["truncated"] is False


async def test_the_stream_sends_exactly_the_limit(api: Api, sid: str) -> None:
    r = await api.client.post(f"/v1/sandboxes/{sid}/exec/stream",
                              json={"cmd": printing(20 * SMALL), "max_output_bytes": SMALL})
    assert r.status_code == 200, r.text
    out, exits = "", []
    for block in r.text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if fields["event"] == "stdout":
            out += json.loads(fields["data"])["data"]
        elif fields["event"] == "exit":
            exits.append(json.loads(fields["data"]))
    assert out == "a" * SMALL
    assert len(exits) == 1 and exits[0]["truncated"] is True and exits[0]["exit_code"] == 0


async def test_server_memory_stays_below_the_output(api: Api, sid: str) -> None:
    """4 MiB go by a request that keeps 1000 bytes: what this process (the server, and
    in-process the host) allocated at its peak is a fraction of it. Before the limit was
    passed down, the host kept up to 64 MiB of each stream for the result (all 4 MiB here,
    over the bound). Each MiB crosses the guest channel under TCG: it was 16 MiB a mode."""
    total = 4 << 20
    tracemalloc.start()
    try:
        result = await run(api, sid, printing(total), max_output_bytes=SMALL)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result["stdout"] == "a" * SMALL and result["truncated"] is True
    assert peak < total // 4, f"peak {peak} bytes traced while {total} went by"
