"""grep and glob through the SDK (sync and async) against a live `pandastack serve` on a real
VM, as a user asks: matches with path, line and text across a tree the guest walks itself
(binary files skipped, a regex-looking pattern taken literally, a name that is not UTF-8
shown with U+FFFD); glob's `*`, `**`; and bad input answered with a clear 4xx, refused by the
SDK before sending and by the server when a raw request gets past it."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from pandastack import AsyncSandbox, Sandbox
from pandastack.guestproto.ops import SEARCH_MAX_PATTERN_BYTES
from pandastack.sdk import InvalidRequestError, NotFoundError
from pandastack.sdk.models import TextMatch
from tests.e2e.conftest import LiveServer
from tests.sdk_credentials import Credentials

pytestmark = [pytest.mark.vm, pytest.mark.e2e, pytest.mark.timeout(600)]

FILES = [
    ("/work/s/a.txt", "hello\nno\nsay HELLO\n"),
    ("/work/s/d/b.py", "x = 'hello'\nf([(x)\n"),
    ("/work/s/d/e/c.py", "pass\n"),
]


def raw(live_server: LiveServer, sandbox_id: str, op: str, body: object) -> httpx.Response:
    """A request the SDK would refuse to send, straight to the REST API."""
    return httpx.post(f"{live_server.api_url}/v1/sandboxes/{sandbox_id}/files/{op}",
                      json=body, headers={"Authorization": f"Bearer {live_server.api_key}"},
                      timeout=60)


def test_grep_and_glob_through_the_sync_sdk(live_server: LiveServer) -> None:
    creds: Credentials = {"api_url": live_server.api_url, "api_key": live_server.api_key}
    with Sandbox.create(template="base", ttl_seconds=300, **creds) as sbx:
        sbx.files.write_many(FILES)
        sbx.files.write("/work/s/bin.dat", b"hello\x00binary\n")
        sbx.exec(r"printf 'hello there\n' > /work/s/n$(printf '\377')m.txt")

        found = sbx.files.grep("/work/s", "hello")
        assert found.matches == [
            TextMatch(path="/work/s/a.txt", line=1, text="hello"),
            TextMatch(path="/work/s/d/b.py", line=1, text="x = 'hello'"),
            TextMatch(path="/work/s/n\ufffdm.txt", line=1, text="hello there"),
        ] and not found.truncated
        folded = sbx.files.grep("/work/s/a.txt", "hello", ignore_case=True)
        assert [(m.path, m.line) for m in folded.matches] == [("/work/s/a.txt", 1),
                                                              ("/work/s/a.txt", 3)]
        # Not a regular expression: an unbalanced bracket is just text to find.
        assert [m.text for m in sbx.files.grep("/work/s", "f([(").matches] == ["f([(x)"]

        assert sbx.files.glob("/work/s", "**/*.py").paths == ["/work/s/d/b.py",
                                                              "/work/s/d/e/c.py"]
        assert sbx.files.glob("/work/s", "*.txt").paths == ["/work/s/a.txt",
                                                            "/work/s/n\ufffdm.txt"]
        assert sbx.files.glob("/work/s", "d/?.py").paths == ["/work/s/d/b.py"]

        too_long = "x" * (SEARCH_MAX_PATTERN_BYTES + 1)
        with pytest.raises(InvalidRequestError, match=str(SEARCH_MAX_PATTERN_BYTES)):
            sbx.files.grep("/work/s", too_long)
        with pytest.raises(InvalidRequestError, match="absolute"):
            sbx.files.glob("work/s", "*")
        with pytest.raises(NotFoundError, match="/work/nope"):
            sbx.files.grep("/work/nope", "x")
        with pytest.raises(InvalidRequestError, match="ENOTDIR"):
            sbx.files.glob("/work/s/a.txt", "*")

        for op, body, says in [
            ("grep", {"path": "/work/s", "pattern": too_long}, "1024"),
            ("grep", {"path": "/work/s", "pattern": "a\nb"}, "newline"),
            ("grep", {"path": "/work/s", "pattern": ""}, "pattern"),
            ("glob", {"path": "/work/s", "pattern": "../../etc/*"}, ".."),
            ("glob", {"path": "/work/s", "pattern": "/etc/*"}, "relative"),
            ("glob", {"path": "etc", "pattern": "*"}, "absolute"),
        ]:
            r = raw(live_server, sbx.id, op, body)
            assert r.status_code == 422, (op, body, r.text)
            assert says in r.json()["error"]["message"], (op, body, r.text)


def test_grep_and_glob_through_the_async_sdk(live_server: LiveServer) -> None:
    async def main() -> None:
        async with await AsyncSandbox.create(template="base", ttl_seconds=300,
                                             api_url=live_server.api_url,
                                             api_key=live_server.api_key) as sbx:
            await sbx.files.write_many(FILES)
            found = await sbx.files.grep("/work/s", "HELLO", ignore_case=True)
            assert [(m.path, m.line) for m in found.matches] == [
                ("/work/s/a.txt", 1), ("/work/s/a.txt", 3), ("/work/s/d/b.py", 1)]
            assert (await sbx.files.glob("/work/s/d", "**")).paths == [
                "/work/s/d/b.py", "/work/s/d/e", "/work/s/d/e/c.py"]

    asyncio.run(main())
