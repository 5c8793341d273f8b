"""E2B's official Python SDK (`e2b` 2.63.0) on files, against a live server and real VMs:
`sbx.files.*`, watching (the sync SDK's polled watcher and the async SDK's stream), uploads
and downloads of 50 MB in bounded server memory, ownership by E2B's default user `user`,
errors as the SDK's exceptions, and signed file URLs."""

from __future__ import annotations

import asyncio
import hashlib
import os
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import (
    AsyncSandbox,
    FileNotFoundException,
    FilesystemEvent,
    FilesystemEventType,
    FileType,
    InvalidArgumentException,
    NotFoundException,
    Sandbox,
    WatchHandle,
)
from e2b.sandbox.filesystem.filesystem import WriteEntry

from tests.e2e.conftest import LiveServer

pytestmark = [pytest.mark.vm, pytest.mark.e2e]

BIG = 50 << 20
CHUNK = 1 << 20


def _opts(live: LiveServer) -> dict[str, Any]:
    return live.e2b(http_version="1.1", request_timeout=120)


@pytest.fixture(scope="module")
def sbx(live_server: LiveServer) -> Iterator[Sandbox]:
    sandbox = Sandbox.create("base", timeout=900, envs={"E2B_FILES_TEST": "yes"},
                             **_opts(live_server))
    try:
        yield sandbox
    finally:
        sandbox.kill()


def _server_pid(live: LiveServer) -> int:
    port = urllib.parse.urlsplit(live.api_url).port
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\x00")
        except OSError:
            continue
        if b"serve" in argv and str(port).encode() in argv:
            return int(entry.name)
    raise AssertionError(f"no server process on port {port}")


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no VmHWM")


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # 5: reset the peak RSS (VmHWM)


def _big_chunks() -> Iterator[bytes]:
    block = os.urandom(CHUNK)
    for i in range(BIG // CHUNK):
        yield i.to_bytes(4, "big") + block[4:]


def test_text_bytes_info_and_exists(sbx: Sandbox) -> None:
    info = sbx.files.write("notes/hello.txt", "héllo\n")
    assert (info.name, info.path, info.type) == ("hello.txt", "/home/user/notes/hello.txt",
                                                 FileType.FILE)
    assert sbx.files.read("notes/hello.txt") == "héllo\n"
    blob = bytes(range(256)) * 3
    sbx.files.write("/home/user/notes/blob.bin", blob)
    assert bytes(sbx.files.read("notes/blob.bin", format="bytes")) == blob

    got = sbx.files.get_info("notes/hello.txt")
    assert (got.name, got.type, got.path, got.size) == (
        "hello.txt", FileType.FILE, "/home/user/notes/hello.txt", len("héllo\n".encode()))
    assert (got.mode, got.permissions, got.owner, got.group) == (
        0o644, "-rw-r--r--", "user", "user")
    assert got.modified_time.tzinfo is not None
    notes = sbx.files.get_info("notes")  # made for the write, owned by the user too
    assert (notes.type, notes.permissions, notes.owner, notes.group) == (
        FileType.DIR, "drwxr-xr-x", "user", "user")
    assert sbx.files.exists("notes/hello.txt")
    assert not sbx.files.exists("notes/nope.txt")
    as_root = sbx.files.write("/root/r.txt", "r", user="root")
    assert as_root.path == "/root/r.txt"
    assert sbx.files.get_info("r.txt", user="root").owner == "root"


def test_list_with_depth(sbx: Sandbox) -> None:
    sbx.files.write_files([WriteEntry(path="tree/a.txt", data="a"),
                           WriteEntry(path="tree/sub/b.txt", data="b"),
                           WriteEntry(path="tree/sub/deeper/c.txt", data=b"c")])
    one = {e.path: e for e in sbx.files.list("tree")}
    assert set(one) == {"/home/user/tree/a.txt", "/home/user/tree/sub"}
    assert one["/home/user/tree/sub"].type == FileType.DIR
    two = {e.path for e in sbx.files.list("tree", depth=2)}
    assert two == {"/home/user/tree/a.txt", "/home/user/tree/sub",
                   "/home/user/tree/sub/b.txt", "/home/user/tree/sub/deeper"}
    three = {e.path for e in sbx.files.list("/home/user/tree", depth=3)}
    assert "/home/user/tree/sub/deeper/c.txt" in three
    assert all(e.owner == "user" for e in sbx.files.list("tree", depth=3))
    with pytest.raises(Exception, match="not a directory"):
        sbx.files.list("tree/a.txt")


def test_make_dir_rename_remove(sbx: Sandbox) -> None:
    assert sbx.files.make_dir("made/x/y") is True
    assert sbx.files.make_dir("made/x/y") is False  # already there
    assert sbx.files.get_info("made/x").owner == "user"
    sbx.files.write("made/x/y/f.txt", "f")
    moved = sbx.files.rename("made/x/y/f.txt", "made/elsewhere/g.txt")
    assert moved.path == "/home/user/made/elsewhere/g.txt" and moved.type == FileType.FILE
    assert not sbx.files.exists("made/x/y/f.txt")
    assert sbx.files.read("made/elsewhere/g.txt") == "f"
    sbx.files.remove("made")
    assert not sbx.files.exists("made")
    sbx.files.remove("made")  # gone already: nothing to do, as envd answers


def test_errors_are_the_sdks_exceptions(sbx: Sandbox) -> None:
    with pytest.raises(FileNotFoundException):
        sbx.files.read("missing/file.txt")
    with pytest.raises(NotFoundException):  # the deprecated name still catches it
        sbx.files.read("missing/file.txt")
    with pytest.raises(FileNotFoundException):
        sbx.files.get_info("missing")
    with pytest.raises(FileNotFoundException):
        sbx.files.rename("missing", "other")
    with pytest.raises(FileNotFoundException):
        sbx.files.list("missing")


def test_write_files_several_owned_by_user(sbx: Sandbox) -> None:
    written = sbx.files.write_files([
        WriteEntry(path="several/one.txt", data="1"),
        WriteEntry(path="several/deep/two.bin", data=b"\x00\x02"),
        WriteEntry(path="/tmp/e2b-three.txt", data="3"),
    ])
    assert [w.path for w in written] == ["/home/user/several/one.txt",
                                         "/home/user/several/deep/two.bin",
                                         "/tmp/e2b-three.txt"]
    for path in ("several/one.txt", "several/deep", "several/deep/two.bin",
                 "/tmp/e2b-three.txt"):
        info = sbx.files.get_info(path)
        assert (info.owner, info.group) == ("user", "user"), path
    assert bytes(sbx.files.read("several/deep/two.bin", format="bytes")) == b"\x00\x02"


def _events_until(handle: WatchHandle, wanted: set[tuple[FilesystemEventType, str]]
                  ) -> list[FilesystemEvent]:
    seen: list[FilesystemEvent] = []
    for _ in range(40):  # each poll waits for events on their way; bounded in count
        seen += handle.get_new_events()
        if wanted <= {(e.type, e.name) for e in seen}:
            return seen
    raise AssertionError(f"events {wanted} not all seen in {seen}")


def _envd_headers(sbx: Sandbox) -> dict[str, str]:
    return {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983",
            "X-Access-Token": sbx._envd_access_token or ""}


def test_watch_dir_polled(sbx: Sandbox, live_server: LiveServer) -> None:
    sbx.files.make_dir("watched/inner")
    handle = sbx.files.watch_dir("watched", recursive=True)
    try:
        sbx.files.write("watched/a.txt", "a")
        sbx.files.write("watched/inner/b.txt", "b")
        sbx.files.rename("watched/a.txt", "watched/c.txt")
        sbx.files.remove("watched/inner/b.txt")
        _events_until(handle, {(FilesystemEventType.CREATE, "a.txt"),
                               (FilesystemEventType.WRITE, "a.txt"),
                               (FilesystemEventType.CREATE, "inner/b.txt"),
                               (FilesystemEventType.RENAME, "a.txt"),
                               (FilesystemEventType.CREATE, "c.txt"),
                               (FilesystemEventType.REMOVE, "inner/b.txt")})
    finally:
        handle.stop()
    gone = httpx.post(f"http://127.0.0.1:{live_server.preview_port}"
                      "/filesystem.Filesystem/GetWatcherEvents",
                      json={"watcherId": handle._watcher_id}, headers=_envd_headers(sbx))
    assert gone.status_code == 404 and gone.json()["code"] == "not_found"


def test_a_new_files_events_are_envds(sbx: Sandbox) -> None:
    """A write of a new file reads as envd's: CREATE, WRITE, then CHMOD (the chown to the
    user), and nothing more (E2B's own tests count them)."""
    sbx.files.make_dir("counted")
    handle = sbx.files.watch_dir("counted")
    try:
        sbx.files.write("counted/new.txt", "content")
        seen = _events_until(handle, {(FilesystemEventType.CHMOD, "new.txt")})
        seen += handle.get_new_events()
    finally:
        handle.stop()
    assert [e.type for e in seen] == [FilesystemEventType.CREATE, FilesystemEventType.WRITE,
                                      FilesystemEventType.CHMOD]


async def test_watch_dir_streamed(sbx: Sandbox, live_server: LiveServer) -> None:
    asbx = await AsyncSandbox.connect(sbx.sandbox_id, **_opts(live_server))
    await asbx.files.make_dir("streamed")
    got: asyncio.Queue[tuple[FilesystemEventType, str]] = asyncio.Queue()
    handle = await asbx.files.watch_dir("streamed", lambda e: got.put_nowait((e.type, e.name)))
    try:
        await asbx.files.write("streamed/s.txt", "s")
        seen = set()
        while (FilesystemEventType.WRITE, "s.txt") not in seen:
            seen.add(await asyncio.wait_for(got.get(), 60))
        assert (FilesystemEventType.CREATE, "s.txt") in seen
    finally:
        await handle.stop()  # type: ignore[no-untyped-call]  # e2b leaves it unannotated


def test_fifty_megabytes_each_way_in_bounded_memory(sbx: Sandbox,
                                                    live_server: LiveServer) -> None:
    pid = _server_pid(live_server)
    digest = hashlib.sha256()
    chunks = list(_big_chunks())
    for c in chunks:
        digest.update(c)
    _reset_peak(pid)
    before = _peak_rss(pid)
    info = sbx.files.write("big/fifty.bin", iter(chunks))  # streamed, octet-stream
    assert info.path == "/home/user/big/fifty.bin"
    assert sbx.files.get_info("big/fifty.bin").size == BIG
    after_upload = _peak_rss(pid)
    _reset_peak(pid)
    down = hashlib.sha256()
    size = 0
    with sbx.files.read("big/fifty.bin", format="stream") as stream:
        for piece in stream:
            down.update(piece)
            size += len(piece)
    after_download = _peak_rss(pid)
    assert size == BIG and down.hexdigest() == digest.hexdigest()
    # Holding the file would add 50 MB (and more for copies) to the server's peak.
    assert after_upload - before < 20 << 20, (before, after_upload)
    assert after_download - before < 20 << 20, (before, after_download)
    sbx.files.remove("big")


def _fetch_signed(live: LiveServer, sbx: Sandbox, url: str, method: str = "GET",
                  **kw: object) -> httpx.Response:
    # E2B_SANDBOX_URL mode gives signed URLs with no sandbox in them; a browser reaches the
    # daemon by its host name (E2B_DOMAIN mode), which is what is sent here, with no token:
    # the URL's signature alone opens the file it names.
    query = urllib.parse.urlsplit(url).query
    return httpx.request(method, f"http://127.0.0.1:{live.preview_port}/files?{query}",
                         headers={"Host": f"49983-{sbx.sandbox_id}.localhost"},
                         timeout=60, **kw)  # type: ignore[arg-type]


def test_signed_urls(sbx: Sandbox, live_server: LiveServer) -> None:
    sbx.files.write("signed.txt", "signed content")
    url = sbx.download_url("signed.txt", user="user", use_signature_expiration=120)
    ok = _fetch_signed(live_server, sbx, url)
    assert ok.status_code == 200 and ok.text == "signed content"

    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
    tampered = {**query, "path": "/etc/shadow"}
    bad = _fetch_signed(live_server, sbx, "?" + urllib.parse.urlencode(tampered))
    assert bad.status_code == 401 and bad.json() == {"code": 401,
                                                     "message": "invalid signature"}
    expired = sbx.download_url("signed.txt", user="user", use_signature_expiration=-120)
    old = _fetch_signed(live_server, sbx, expired)
    assert old.status_code == 401
    assert old.json() == {"code": 401, "message": "signature is already expired"}

    up = sbx.upload_url("uploaded/by-url.txt", user="user", use_signature_expiration=120)
    sent = _fetch_signed(live_server, sbx, up, "POST",
                         files={"file": ("by-url.txt", b"via a signed URL")})
    assert sent.status_code == 200, sent.text
    assert sent.json()[0]["path"] == "/home/user/uploaded/by-url.txt"
    assert sbx.files.read("uploaded/by-url.txt") == "via a signed URL"
    assert sbx.files.get_info("uploaded/by-url.txt").owner == "user"
    # a download URL's signature does not upload
    wrong_op = _fetch_signed(live_server, sbx, url, "POST",
                             files={"file": ("signed.txt", b"overwritten")})
    assert wrong_op.status_code == 401
    assert sbx.files.read("signed.txt") == "signed content"


def test_health_envs_and_metrics(sbx: Sandbox, live_server: LiveServer) -> None:
    headers = _envd_headers(sbx)
    base = f"http://127.0.0.1:{live_server.preview_port}"
    assert httpx.get(f"{base}/health", headers=headers).status_code == 204
    envs = httpx.get(f"{base}/envs", headers=headers)
    assert envs.status_code == 200 and envs.json().get("E2B_FILES_TEST") == "yes"
    metrics = httpx.get(f"{base}/metrics", headers=headers, timeout=60).json()
    assert metrics["cpu_count"] >= 1 and 0 < metrics["mem_used"] < metrics["mem_total"]
    assert 0 < metrics["disk_used"] < metrics["disk_total"]


def test_bad_input_is_a_clear_4xx(sbx: Sandbox, live_server: LiveServer) -> None:
    base = f"http://127.0.0.1:{live_server.preview_port}"
    headers = _envd_headers(sbx)

    def rpc(method: str, body: object) -> httpx.Response:
        return httpx.post(f"{base}/filesystem.Filesystem/{method}", json=body,
                          headers=headers, timeout=60)

    for method, body, status, code in [
        ("Stat", {"path": 7}, 400, "invalid_argument"),
        ("ListDir", {"path": "/", "depth": "many"}, 400, "invalid_argument"),
        ("ListDir", {"path": "/etc/hostname"}, 400, "invalid_argument"),
        ("CreateWatcher", {"path": "/tmp", "recursive": "yes"}, 400, "invalid_argument"),
        ("CreateWatcher", {"path": "/nope"}, 404, "not_found"),
        ("GetWatcherEvents", {"watcherId": "w-" + "0" * 24}, 404, "not_found"),
        ("GetWatcherEvents", {}, 400, "invalid_argument"),
        ("Remove", {"path": "/"}, 400, "invalid_argument"),
        ("MakeDir", {"path": "/etc/hostname"}, 400, "invalid_argument"),
        ("Stat", {"path": "a\u0000b"}, 400, "invalid_argument"),
    ]:
        answer = rpc(method, body)
        assert (answer.status_code, answer.json()["code"]) == (status, code), (method, body,
                                                                             answer.text)
    assert rpc("ListDir", {"path": "/etc", "depth": "1"}).status_code == 200

    def files(method: str, params: dict[str, str] | None = None, content: bytes | None = None,
              extra: dict[str, str] | None = None) -> httpx.Response:
        return httpx.request(method, f"{base}/files", headers={**headers, **(extra or {})},
                             params=params, content=content, timeout=60)

    for answer, status in [
        (files("POST", params={"path": "x.txt"}, content=b"x",
               extra={"Content-Type": "text/plain"}), 400),
        (files("POST", content=b"x", extra={"Content-Type": "application/octet-stream"}), 400),
        (files("POST", params={"path": "x.txt"}, content=b"not gzip",
               extra={"Content-Type": "application/octet-stream",
                      "Content-Encoding": "gzip"}), 400),
        (files("POST", content=b"--b\r\nbroken",
               extra={"Content-Type": "multipart/form-data; boundary=b"}), 400),
        (files("POST", params={"path": "/home/user"}, content=b"x",
               extra={"Content-Type": "application/octet-stream"}), 400),
        (files("GET", params={"path": "/home/user"}), 400),
        (files("GET", params={"path": "/no/such/file"}), 404),
        (files("GET", params={"path": "x", "username": "-rf"}), 401),
        (files("GET", params={"path": "x", "signature_expiration": "1"}), 400),
        (files("POST", params={"path": "x", "username": "nobody-here"}, content=b"x",
               extra={"Content-Type": "application/octet-stream"}), 401),
    ]:
        assert answer.status_code == status, (answer.request.url, answer.text)
        assert answer.json()["code"] == status and answer.json()["message"]


def test_metadata_as_envd_0_6_2_keeps_it(sbx: Sandbox) -> None:
    assert str(sbx._envd_version) == "0.6.4"  # what the SDK gates metadata and entries on
    one = sbx.files.write("meta/a.txt", "a", metadata={"Author": "mish", "k": "v 1"})
    assert one.metadata == {"author": "mish", "k": "v 1"}
    streamed = sbx.files.write("meta/b.bin", iter([b"b" * 10]), metadata={"kind": "blob"})
    assert streamed.metadata == {"kind": "blob"}
    both = sbx.files.write_files([WriteEntry(path="meta/c.txt", data="c"),
                                  WriteEntry(path="meta/d.txt", data="d")],
                                 metadata={"batch": "1"})
    assert [w.metadata for w in both] == [{"batch": "1"}, {"batch": "1"}]
    assert sbx.files.get_info("meta/a.txt").metadata == {"author": "mish", "k": "v 1"}
    assert sbx.files.get_info("meta/b.bin").metadata == {"kind": "blob"}
    listed = {e.name: e.metadata for e in sbx.files.list("meta")}
    assert listed == {"a.txt": {"author": "mish", "k": "v 1"}, "b.bin": {"kind": "blob"},
                      "c.txt": {"batch": "1"}, "d.txt": {"batch": "1"}}
    assert sbx.files.rename("meta/a.txt", "meta/moved.txt").metadata == {
        "author": "mish", "k": "v 1"}
    sbx.files.write("meta/moved.txt", "again")  # an upload replaces it: none here
    assert sbx.files.get_info("meta/moved.txt").metadata is None
    sbx.commands.run("python3 -c \"import os; os.setxattr('/home/user/meta/c.txt', "
                     "'user.e2b.by', b'hand')\"")
    assert sbx.files.get_info("meta/c.txt").metadata == {"batch": "1", "by": "hand"}
    with pytest.raises(InvalidArgumentException):
        sbx.files.write("meta/bad.txt", "x", metadata={"k": "\u00e9"})


def test_watch_events_with_entries(sbx: Sandbox) -> None:
    sbx.files.make_dir("entries")
    handle = sbx.files.watch_dir("entries", include_entry=True, allow_network_mounts=True)
    try:
        sbx.files.write("entries/e.txt", "e")
        sbx.files.remove("entries/e.txt")
        seen = _events_until(handle, {(FilesystemEventType.WRITE, "e.txt"),
                                      (FilesystemEventType.REMOVE, "e.txt")})
    finally:
        handle.stop()
    removed = [e for e in seen if e.type == FilesystemEventType.REMOVE]
    assert removed[0].entry is None  # nothing there to describe any more
    for e in seen:
        if e.entry is not None:
            assert (e.entry.path, e.entry.type, e.entry.owner) == (
                "/home/user/entries/e.txt", FileType.FILE, "user")


async def test_streamed_watch_events_with_entries(sbx: Sandbox,
                                                  live_server: LiveServer) -> None:
    asbx = await AsyncSandbox.connect(sbx.sandbox_id, **_opts(live_server))
    await asbx.files.make_dir("entries-streamed")
    got: asyncio.Queue[object] = asyncio.Queue()
    handle = await asbx.files.watch_dir("entries-streamed", got.put_nowait, include_entry=True)
    try:
        await asbx.files.write("entries-streamed/s.txt", "s")
        while True:
            event = await asyncio.wait_for(got.get(), 60)
            if event.type == FilesystemEventType.WRITE:  # type: ignore[attr-defined]
                break
        entry = event.entry  # type: ignore[attr-defined]
        assert entry is not None and entry.path == "/home/user/entries-streamed/s.txt"
        assert entry.size == 1
    finally:
        await handle.stop()  # type: ignore[no-untyped-call]  # e2b leaves it unannotated
