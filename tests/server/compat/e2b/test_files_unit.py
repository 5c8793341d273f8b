"""Pure logic of E2B's filesystem service and /files: signatures as the SDK computes them,
path resolution, EntryInfo as the SDK parses it (from this host's own `find`), the ENSURE
script (run by this host's sh), event translation and the polled watcher's queue."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import subprocess
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from e2b.envd.filesystem import filesystem_pb
from e2b.sandbox.filesystem.filesystem import EntryInfo, FileType, map_entry_info
from e2b.sandbox.signature import get_signature
from starlette.requests import Request

from pandastack.hostport.watch import WatchEvent
from pandastack.server.compat.e2b.envd import filesystem, guestfs, lister
from pandastack.server.compat.e2b.envd.connect import ConnectError
from pandastack.server.compat.e2b.envd.files import expected_signature, signed_request
from pandastack.server.compat.e2b.errors import E2bError
from pandastack.server.compat.e2b.target import SandboxTarget
from pandastack.server.compat.e2b.tokens import tokens_for
from pandastack.server.store import open_store


@pytest.mark.parametrize("user", [None, "user", "root"])
@pytest.mark.parametrize("expiration", [None, 120, -120])
def test_signature_is_the_sdks(user: str | None, expiration: int | None) -> None:
    token = "ab" * 32
    sdk = get_signature("dir/ä b.txt", "read", user, token, expiration)
    ours = expected_signature("dir/ä b.txt", "read", user or "", token, sdk["expiration"])
    assert ours == sdk["signature"]
    assert ours != expected_signature("dir/ä b.txt", "write", user or "", token,
                                      sdk["expiration"])


def test_relative_paths_start_in_the_users_home() -> None:
    assert guestfs.resolve("a/b.txt", "user") == "/home/user/a/b.txt"
    assert guestfs.resolve("a/b.txt", "root") == "/root/a/b.txt"
    assert guestfs.resolve("~", "user") == "/home/user"
    assert guestfs.resolve("~/x/../y", "user") == "/home/user/y"
    assert guestfs.resolve("", "user") == "/home/user"
    assert guestfs.resolve("//etc/../etc/hosts", "user") == "/etc/hosts"
    assert guestfs.resolve("../../..", "user") == "/"
    with pytest.raises(E2bError) as nul:
        guestfs.resolve("a\x00b", "user")
    assert nul.value.status == 400


def test_user_names_that_cannot_be_users_are_401() -> None:
    for bad in ("-rf", "a b", "x" * 40, "$(id)", "a:b"):
        with pytest.raises(E2bError) as err:
            guestfs.user_of(_target(None), bad)
        assert err.value.status == 401
    assert guestfs.user_of(_target(None)) == "user"
    assert guestfs.user_of(_target("root")) == "root"
    assert guestfs.user_of(_target("root"), "user") == "user"


def _target(user: str | None) -> SandboxTarget:
    return SandboxTarget(service=None, team="t", sandbox_id="sbx-x", port=49983,  # type: ignore[arg-type]
                         user=user)


def _find(*args: str) -> list[guestfs.Entry]:
    out = subprocess.run(["find", *args, "-printf", guestfs.FIND_FORMAT], check=True,
                         capture_output=True).stdout
    return guestfs.parse_find(out)


def _as_sdk(info: dict[str, object]) -> EntryInfo:
    return map_entry_info(filesystem_pb.EntryInfo.from_json(json.dumps(info)))


def test_entries_as_the_sdk_reads_them(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir(mode=0o755)
    (tmp_path / "d").chmod(0o755)
    f = tmp_path / "d" / "f.txt"
    f.write_bytes(b"hello")
    f.chmod(0o644)
    (tmp_path / "d" / "link").symlink_to("f.txt")
    (tmp_path / "d" / "dangling").symlink_to("/nonexistent/x")
    (tmp_path / "d" / "sub").mkdir()
    (tmp_path / "d" / "sub" / "deep").write_text("x")
    odd = os.fsencode(str(tmp_path / "d")) + b"/odd\xff\nname"
    Path(os.fsdecode(odd)).write_text("y")
    me = pwd.getpwuid(os.getuid()).pw_name

    entries = _find("-H", str(tmp_path / "d"), "-maxdepth", "1")
    assert entries[0].path == str(tmp_path / "d") and entries[0].kind == "d"
    parsed = [_as_sdk(guestfs.entry_info(e)) for e in entries[1:]]
    by_name = {i.name: i for i in parsed}
    assert "deep" not in by_name  # depth 1
    info = by_name["f.txt"]
    assert (info.type, info.size, info.mode, info.permissions) == (
        FileType.FILE, 5, 0o644, "-rw-r--r--")
    assert (info.owner, info.group, info.path) == (me, me if me == "root" else info.group,
                                                   str(f))
    assert info.symlink_target is None
    assert info.modified_time.tzinfo is not None
    assert abs(info.modified_time.timestamp() - f.stat().st_mtime) < 1e-3
    link = by_name["link"]
    assert link.type == FileType.FILE and link.symlink_target == str(f)
    assert link.permissions == "lrwxrwxrwx"
    assert by_name["dangling"].type == FileType.SYMLINK
    assert by_name["dangling"].symlink_target == "/nonexistent/x"
    assert by_name["sub"].type == FileType.DIR and by_name["sub"].permissions.startswith("d")
    # a name that is not UTF-8 (and holds a newline) is one entry, shown with U+FFFD
    assert any(n.startswith("odd\ufffd\nname") for n in by_name)

    deeper = _find("-H", str(tmp_path / "d"), "-maxdepth", "2")
    assert str(tmp_path / "d" / "sub" / "deep") in [e.path for e in deeper]


def test_timestamps_are_rfc3339_utc() -> None:
    assert guestfs.timestamp("0.0000000000") == "1970-01-01T00:00:00Z"
    assert guestfs.timestamp("1701640491.1234567890") == "2023-12-03T21:54:51.123456789Z"
    assert guestfs.timestamp("1701640491.5000000000") == "2023-12-03T21:54:51.5Z"
    assert guestfs.timestamp("garbage") == "1970-01-01T00:00:00Z"


def _ensure(tmp: Path, kind: str, path: Path, user: str = "root", data: bytes = b"") -> int:
    return subprocess.run(["sh", "-c", guestfs.ENSURE, "ensure", user, kind, str(path), ""],
                          capture_output=True, check=False, input=data).returncode


def test_ensure_makes_missing_parents_and_says_what_is_in_the_way(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c.txt"
    assert _ensure(tmp_path, "file", target) == 0
    assert target.is_file() and target.read_bytes() == b""
    assert oct((tmp_path / "a" / "b").stat().st_mode & 0o777) == "0o755"
    target.write_text("kept")
    assert _ensure(tmp_path, "file", target) == 0 and target.read_text() == "kept"
    assert _ensure(tmp_path, "file", tmp_path / "a") == guestfs.EXIT_IS_DIR
    assert _ensure(tmp_path, "file", target / "x") == guestfs.EXIT_NOT_DIR
    assert _ensure(tmp_path, "dir", tmp_path / "n" / "m") == 0
    assert (tmp_path / "n" / "m").is_dir()
    assert _ensure(tmp_path, "dir", tmp_path / "n" / "m") == guestfs.EXIT_EXISTS_DIR
    assert _ensure(tmp_path, "dir", target) == guestfs.EXIT_EXISTS_OTHER
    assert _ensure(tmp_path, "parents", tmp_path / "p" / "q" / "r") == 0
    assert (tmp_path / "p" / "q").is_dir() and not (tmp_path / "p" / "q" / "r").exists()
    assert _ensure(tmp_path, "file", tmp_path / "u", "no-such-user-xyz") == guestfs.EXIT_NO_USER
    assert not (tmp_path / "u").exists()


def test_ensure_writes_a_small_upload_from_stdin(tmp_path: Path) -> None:
    target = tmp_path / "s" / "t" / "small.bin"
    assert _ensure(tmp_path, "stdin", target, data=b"\x00one\xff") == 0
    assert target.read_bytes() == b"\x00one\xff"
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    target.chmod(0o600)
    assert _ensure(tmp_path, "stdin", target, data=b"two") == 0  # overwritten, mode kept
    assert target.read_bytes() == b"two" and oct(target.stat().st_mode & 0o777) == "0o600"
    assert _ensure(tmp_path, "stdin", target, data=b"") == 0 and target.read_bytes() == b""
    assert _ensure(tmp_path, "stdin", tmp_path / "s", data=b"x") == guestfs.EXIT_IS_DIR
    assert _ensure(tmp_path, "stdin", target / "x", data=b"x") == guestfs.EXIT_NOT_DIR


def test_events_read_as_envds() -> None:
    root = "/home/user/w"
    assert filesystem.fs_events(root, WatchEvent("write", "/home/user/w/a/b.txt")) == [
        {"name": "a/b.txt", "type": "EVENT_TYPE_WRITE"}]
    assert filesystem.fs_events(root, WatchEvent("rename", "/home/user/w/new",
                                                 "/home/user/w/old")) == [
        {"name": "old", "type": "EVENT_TYPE_RENAME"},
        {"name": "new", "type": "EVENT_TYPE_CREATE"}]
    assert filesystem.fs_events(root, WatchEvent("watching", root)) == []


async def _batches(*batches: list[WatchEvent], hold: asyncio.Event | None = None
                   ) -> AsyncIterator[list[WatchEvent]]:
    for b in batches:
        yield b
    if hold is not None:
        await hold.wait()


async def test_watcher_queue_is_bounded_and_says_why_it_ended(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(filesystem, "MAX_QUEUED_EVENTS", 3)
    w = filesystem.Watcher("sbx-a", "/r")
    many = [WatchEvent("create", f"/r/{i}") for i in range(5)]
    await w.pull(_batches(many))
    assert [e["name"] for e in await w.take()] == ["0", "1", "2"]
    assert w.finished and w.ended is not None and w.ended.code == "resource_exhausted"

    gone = filesystem.Watcher("sbx-a", "/r")
    await gone.pull(_batches([WatchEvent("write", "/r/x")]))
    assert gone.ended is not None and gone.ended.code == "not_found"


async def test_a_poll_waits_briefly_for_events_on_their_way() -> None:
    hold = asyncio.Event()
    source: asyncio.Queue[list[WatchEvent]] = asyncio.Queue()

    async def batches() -> AsyncIterator[list[WatchEvent]]:
        while not hold.is_set():
            yield await source.get()

    w = filesystem.Watcher("sbx-a", "/r")
    w.task = asyncio.create_task(w.pull(batches()))
    poll = asyncio.create_task(w.take())
    await asyncio.sleep(0)
    source.put_nowait([WatchEvent("create", "/r/f")])
    source.put_nowait([WatchEvent("write", "/r/f")])
    assert [e["type"] for e in await poll] == ["EVENT_TYPE_CREATE", "EVENT_TYPE_WRITE"]
    w.stop()
    with pytest.raises(asyncio.CancelledError):
        await w.task


def test_watchers_are_bounded_and_each_sandbox_sees_only_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(filesystem, "MAX_WATCHERS_PER_SANDBOX", 2)
    registry = filesystem.Watchers()
    a1 = registry.add(filesystem.Watcher("sbx-a", "/r"))
    registry.add(filesystem.Watcher("sbx-a", "/r"))
    with pytest.raises(ConnectError) as full:
        registry.add(filesystem.Watcher("sbx-a", "/r"))
    assert full.value.code == "resource_exhausted"
    registry.add(filesystem.Watcher("sbx-b", "/r"))
    with pytest.raises(ConnectError) as other:
        registry.get("sbx-b", a1)
    assert other.value.code == "not_found"
    registry.remove("sbx-a", a1)
    with pytest.raises(ConnectError):
        registry.get("sbx-a", a1)
    stale = filesystem.Watcher("sbx-c", "/r", polled_at=0.0)
    registry.by_id["w-stale"] = stale
    registry.sweep()
    assert "w-stale" not in registry.by_id


def _conn(method: str, path: str, query: dict[str, str]) -> Request:
    return Request({"type": "http", "method": method, "path": path, "headers": [],
                    "query_string": urllib.parse.urlencode(query).encode()})


def test_signed_urls_open_by_themselves_and_only_as_signed(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'p.db'}")
    try:
        token = tokens_for(store).envd_access("sbx-0123456789ab")
        sig = get_signature("a b.txt", "read", "user", token, 60)
        assert sig["expiration"] is not None  # given a lifetime, it has an end
        query = {"path": "a b.txt", "username": "user", "signature": sig["signature"],
                 "signature_expiration": str(sig["expiration"])}
        assert signed_request(_conn("GET", "/files", query), "sbx-0123456789ab", store)
        assert not signed_request(_conn("GET", "/files", {"path": "x"}), "sbx-0123456789ab",
                                  store)
        refusals = [
            ("POST", "/files", query, "invalid signature"),  # a read's signature
            ("GET", "/files", {**query, "path": "/etc/shadow"}, "invalid signature"),
            ("GET", "/files", {**query, "username": "root"}, "invalid signature"),
            ("GET", "/files", {**query, "signature_expiration": str(sig["expiration"] + 1)},
             "invalid signature"),
            ("GET", "/envs", query, "only /files takes a signature"),
        ]
        for method, path, q, message in refusals:
            with pytest.raises(E2bError) as err:
                signed_request(_conn(method, path, q), "sbx-0123456789ab", store)
            assert (err.value.status, err.value.message) == (401, message)
        with pytest.raises(E2bError) as other:  # another sandbox's token signs nothing here
            signed_request(_conn("GET", "/files", query), "sbx-ba9876543210", store)
        assert other.value.status == 401
        old = get_signature("a b.txt", "read", None, token, -120)
        with pytest.raises(E2bError) as expired:
            signed_request(_conn("GET", "/files", {
                "path": "a b.txt", "signature": old["signature"],
                "signature_expiration": str(old["expiration"])}), "sbx-0123456789ab", store)
        assert expired.value.message == "signature is already expired"
    finally:
        store.close()


def _listing(*args: str) -> list[guestfs.Entry]:
    res = subprocess.run(["perl", "-e", lister.LIST, *args], capture_output=True, check=False)
    assert res.returncode in (0, 1), res.stderr
    return guestfs.parse_listing(res.stdout)


def test_the_perl_lister_says_what_find_says_and_the_metadata(tmp_path: Path) -> None:
    (tmp_path / "d" / "sub").mkdir(parents=True)
    f = tmp_path / "d" / "f.txt"
    f.write_text("hello")
    (tmp_path / "d" / "link").symlink_to("f.txt")
    (tmp_path / "d" / "dangling").symlink_to("/nonexistent/x")
    (tmp_path / "d" / "sub" / "deep").write_text("x")
    os.setxattr(f, "user.e2b.author", b"mish")
    os.setxattr(f, "user.other", b"not ours")
    for depth in ("0", "1", "2"):
        ours = _listing(depth, "1", str(tmp_path / "d"))
        theirs = _find("-H", str(tmp_path / "d"), "-maxdepth", depth)
        assert sorted(e.path for e in ours) == sorted(e.path for e in theirs)
        by_path = {e.path: e for e in theirs}
        for e in ours:
            t = by_path[e.path]
            assert (e.kind, e.target_kind, e.size, e.mode, e.owner, e.group, e.link) == (
                t.kind, t.target_kind, t.size, t.mode, t.owner, t.group, t.link), e.path
            assert abs(float(e.mtime) - float(t.mtime)) < 1e-6
    info = {e.path: guestfs.entry_info(e) for e in _listing("1", "0", str(tmp_path / "d"))}
    assert info[str(f)]["metadata"] == {"author": "mish"}
    assert "metadata" not in info[str(tmp_path / "d" / "link")]
    missing = subprocess.run(["perl", "-e", lister.LIST, "0", "0", str(tmp_path / "nope")],
                             capture_output=True, check=False)
    assert missing.returncode == 1 and b"No such file" in missing.stderr


def test_metadata_is_replaced_by_each_upload(tmp_path: Path) -> None:
    f = tmp_path / "m.txt"
    f.write_text("x")
    os.setxattr(f, "user.e2b.stale", b"old")

    def set_(*pairs: str) -> None:
        subprocess.run(["perl", "-e", lister.SET, str(f), *pairs], check=True)

    set_("author", "mish", "empty", "")
    assert {k: os.getxattr(f, k) for k in os.listxattr(f)} == {
        "user.e2b.author": b"mish", "user.e2b.empty": b""}
    set_()
    assert os.listxattr(f) == []
    assert _ensure(tmp_path, "stdin", f, data=b"y") == 0  # a plain upload keeps none
    subprocess.run(["sh", "-c", guestfs.ENSURE, "ensure", "root", "stdin", str(f),
                    lister.SET, "k", "v"], input=b"z", check=True)
    assert f.read_bytes() == b"z" and os.getxattr(f, "user.e2b.k") == b"v"
    subprocess.run(["sh", "-c", guestfs.ENSURE, "ensure", "root", "stdin", str(f),
                    lister.SET], input=b"w", check=True)
    assert os.listxattr(f) == []  # an overwrite without metadata clears it


def test_metadata_headers_as_envd_reads_them() -> None:
    assert lister.metadata_of([(b"content-type", b"x")]) is None
    assert lister.metadata_of([(b"X-Metadata-Author", b"mish"), (b"x-metadata-author", b"2"),
                               (b"x-metadata-k", b"")]) == {"author": "mish", "k": ""}
    for bad in [[(b"x-metadata-a", b"\x01")], [(b"x-metadata-" + b"k" * 247, b"v")],
                [(b"x-metadata-a", b"v" * 4090)], [(b"x-metadata-", b"v")]]:
        with pytest.raises(E2bError) as err:
            lister.metadata_of(bad)
        assert err.value.status == 400
