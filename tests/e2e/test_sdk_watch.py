"""File watching, write_many and read formats through the SDK (sync and async) against a
live `pandastack serve` on a real VM: a watch set up by `watch()` sees the create, write,
rename, chmod and remove of a file in order and `stop()` ends its iteration; many files in
one request (a body over the limit is 413, too many files or bad paths 422); a file read as
text, bytes and a stream of chunks."""

from __future__ import annotations

import os
import threading

import pytest

from pandastack import AsyncSandbox, Sandbox
from pandastack.sdk import FileEvent, PayloadTooLargeError, ValidationError
from pandastack.wire.sandboxes import MAX_WRITE_MANY_FILES
from tests.e2e.conftest import LiveServer
from tests.sdk_credentials import Credentials

pytestmark = [pytest.mark.vm, pytest.mark.e2e, pytest.mark.timeout(600)]

SCRIPT = "cd /work/w && echo hi > a && mv a b && chmod 600 b && rm b"
EXPECTED = [("create", "/work/w/a", None), ("write", "/work/w/a", None),
            ("rename", "/work/w/b", "/work/w/a"), ("chmod", "/work/w/b", None),
            ("remove", "/work/w/b", None)]


def brief(e: FileEvent) -> tuple[str, str, str | None]:
    return (e.type, e.path, e.old_path)


def test_sync_watch_write_many_and_read(live_server: LiveServer) -> None:
    creds: Credentials = {"api_url": live_server.api_url, "api_key": live_server.api_key}
    with Sandbox.create(template="base", ttl_seconds=300, **creds) as sbx:
        sbx.files.mkdir("/work/w")
        w = sbx.files.watch("/work/w")
        seen: list[tuple[str, str, str | None]] = []
        sbx.exec(SCRIPT)
        for event in w:
            seen.append(brief(event))
            if len(seen) == len(EXPECTED):
                break
        assert seen == EXPECTED
        stopper = threading.Timer(0.5, w.stop)  # stop() from another thread ends the loop
        stopper.start()
        assert list(w) == [] and w.stopped
        stopper.join()

        blob = os.urandom(3000)
        written = sbx.files.write_many([("/work/m/a.txt", "héllo"), ("/work/m/b.bin", blob)])
        assert [(r.path, r.size) for r in written] == [("/work/m/a.txt", 6),
                                                      ("/work/m/b.bin", 3000)]
        assert sbx.files.read("/work/m/a.txt", format="text") == "héllo"
        assert sbx.files.read("/work/m/b.bin") == blob
        assert sbx.files.read("/work/m/b.bin", format="bytes") == blob
        big = os.urandom(3 * 2**20)
        sbx.files.write("/work/big", big)
        chunks = list(sbx.files.read("/work/big", format="stream"))
        assert len(chunks) > 1 and b"".join(chunks) == big

        with pytest.raises(PayloadTooLargeError):
            sbx.files.write_many([("/work/m/huge", b"x" * 2**20)])
        with pytest.raises(ValidationError):
            sbx.files.write_many([(f"/work/m/{i}", "") for i in range(MAX_WRITE_MANY_FILES + 1)])
        with pytest.raises(ValidationError):
            sbx.files.write_many([("/work/m/\0nul", "x")])
        assert not sbx.files.exists("/work/m/huge")


async def test_async_watch(live_server: LiveServer) -> None:
    creds: Credentials = {"api_url": live_server.api_url, "api_key": live_server.api_key}
    async with await AsyncSandbox.create(template="base", ttl_seconds=300, **creds) as sbx:
        await sbx.files.mkdir("/work/w")
        w = await sbx.files.watch("/work/w", recursive=True)
        seen: list[tuple[str, str, str | None]] = []
        await sbx.exec(SCRIPT)
        async for event in w:
            seen.append(brief(event))
            if len(seen) == len(EXPECTED):
                break
        assert seen == EXPECTED
        await w.stop()
        assert w.stopped and [e async for e in w] == []

        written = await sbx.files.write_many([("/work/m/a", "x"), ("/work/m/b", b"\x00\xff")])
        assert [r.size for r in written] == [1, 2]
        assert await sbx.files.read("/work/m/a", format="text") == "x"
        stream = await sbx.files.read("/work/m/b", format="stream")
        assert b"".join([c async for c in stream]) == b"\x00\xff"
