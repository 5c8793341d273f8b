"""The SDKs' `max_output_bytes` on exec, against a live server over the in-memory host whose
limit (PANDASTACK_MAX_EXEC_OUTPUT_MB) is a few bytes: asked for less, the result (or the
stream) holds exactly that and says `truncated`; asked for more than the server allows,
InvalidRequestError from the server's 422; a negative value never leaves the client."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pandastack.sdk import AsyncSandbox, Sandbox
from pandastack.sdk.errors import InvalidRequestError
from tests.server.live import FakeServer, fake_server

LIMIT = 8
CMD = "echo hello world"
PRINTED = CMD.encode() + b"\xff"  # what the in-memory host prints for a command


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeServer]:
    with fake_server(tmp_path_factory.mktemp("sdk-exec-limit"),
                     max_exec_output_bytes=LIMIT) as srv:
        yield srv


def test_sync(server: FakeServer) -> None:
    with Sandbox.create(api_url=server.url, api_key=server.admin_key) as sbx:
        run = sbx.exec(CMD)
        assert run.stdout == PRINTED[:LIMIT].decode() and run.truncated
        run = sbx.exec(CMD, max_output_bytes=4)
        assert run.stdout == PRINTED[:4].decode() and run.truncated
        chunks: list[str] = []
        run = sbx.commands.run(CMD, max_output_bytes=4, on_stdout=chunks.append)
        assert "".join(chunks) == PRINTED[:4].decode() == run.stdout and run.truncated
        with pytest.raises(InvalidRequestError) as raised:
            sbx.exec(CMD, max_output_bytes=LIMIT + 1)
        assert raised.value.request_id is not None  # the server's 422
        with pytest.raises(InvalidRequestError) as raised:
            sbx.exec(CMD, max_output_bytes=-1)
        assert raised.value.request_id is None  # refused before sending


async def test_async(server: FakeServer) -> None:
    async with await AsyncSandbox.create(api_url=server.url, api_key=server.admin_key) as sbx:
        run = await sbx.exec(CMD, max_output_bytes=4)
        assert run.stdout == PRINTED[:4].decode() and run.truncated
        chunks: list[str] = []
        run = await sbx.exec(CMD, max_output_bytes=LIMIT, on_stdout=chunks.append)
        assert "".join(chunks) == PRINTED[:LIMIT].decode() == run.stdout and run.truncated
        with pytest.raises(InvalidRequestError):
            await sbx.exec(CMD, max_output_bytes=LIMIT + 1)
