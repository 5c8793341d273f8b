"""grep and glob on a real VM, through the sandbox's handle (its listings are built from the
guest table: host/agentlink/bound.py): the guest image's agent walks its own file system
(spec §5 grep / glob)."""

from __future__ import annotations

import pytest

from pandastack.guestproto.ops import SEARCH_MAX_PATTERN_BYTES, GlobResult, GrepMatch, GrepResult
from pandastack.host.runtime.sandbox import SandboxHandle
from pandastack.hostport.errors import GuestOSError

pytestmark = pytest.mark.vm


async def _tree(sandbox: SandboxHandle) -> None:
    await sandbox.write_file("/work/s/a.txt", b"hello\nno\nsay HELLO\n")
    await sandbox.write_file("/work/s/bin.dat", b"hello\0binary\n")
    await sandbox.write_file("/work/s/d/b.py", b"x = 'hello'\n")
    run = await sandbox.exec("ln -s /work/s/d /work/s/link && ln -s /work/s/a.txt /work/s/z")
    assert run.exit_code == 0, run.stderr


async def test_grep_in_the_guest(sandbox: SandboxHandle) -> None:
    await _tree(sandbox)
    got = await sandbox.grep("/work/s", "hello", ignore_case=True)
    assert got == GrepResult([
        GrepMatch("/work/s/a.txt", 1, "hello"),
        GrepMatch("/work/s/a.txt", 3, "say HELLO"),
        GrepMatch("/work/s/d/b.py", 1, "x = 'hello'"),
        GrepMatch("/work/s/z", 1, "hello"),
        GrepMatch("/work/s/z", 3, "say HELLO"),
    ], truncated=False)  # bin.dat is binary; link (to a directory) is not followed
    with pytest.raises(GuestOSError) as err:
        await sandbox.grep("/work/s", "x" * (SEARCH_MAX_PATTERN_BYTES + 1))
    assert err.value.errno_name == "EINVAL" and "pattern" in err.value.message
    with pytest.raises(GuestOSError) as err:
        await sandbox.grep("/work/missing", "hello")
    assert (err.value.errno_name, err.value.path) == ("ENOENT", "/work/missing")


async def test_glob_in_the_guest(sandbox: SandboxHandle) -> None:
    await _tree(sandbox)
    assert await sandbox.glob("/work/s", "**/*.py") == GlobResult(["/work/s/d/b.py"], False)
    assert (await sandbox.glob("/work/s", "*")).paths == [
        "/work/s/a.txt", "/work/s/bin.dat", "/work/s/d", "/work/s/link", "/work/s/z"]
    with pytest.raises(GuestOSError) as err:
        await sandbox.glob("/work/s", "*" * (SEARCH_MAX_PATTERN_BYTES + 1))
    assert err.value.errno_name == "EINVAL"
    with pytest.raises(GuestOSError) as err:
        await sandbox.glob("/work/missing", "*")
    assert (err.value.errno_name, err.value.path) == ("ENOENT", "/work/missing")
