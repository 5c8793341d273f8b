"""E2B's Python SDK (async) against pandastack: py_sync.py's steps through AsyncSandbox, with
the background command's output streamed to a callback.

    python py_async.py REPORT_FILE RUN_ID     (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY set)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import sys
import time

from e2b import CommandExitException, PtySize, SandboxQuery
from e2b_code_interpreter import AsyncSandbox
from report import Report, run_async

BROKEN = "import json\nprint(json.dumps({'answer': 6 * 7})\n"
FIXED = "import json\nprint(json.dumps({'answer': 6 * 7}))\n"
TICKS = "for i in 1 2 3; do echo tick $i; sleep 0.2; done; sleep 300"


async def main(path: str, run_id: str) -> None:
    metadata = {"suite": "e2b-sdk-versions", "run": run_id}
    with open(path, "w") as out:
        report = Report(out)
        box: list[AsyncSandbox] = []

        async def create() -> None:
            box.append(await AsyncSandbox.create(timeout=300, metadata=metadata))
            report.made.append(box[0].sandbox_id)

        await run_async(report, "create", create, needs=())
        try:
            await steps(report, box[0] if box else None, metadata)
        finally:
            if box:
                # The kill step reports its own outcome; this only cleans up after a failure.
                with contextlib.suppress(Exception):
                    await box[0].kill()


async def steps(report: Report, sbx: AsyncSandbox | None, metadata: dict[str, str]) -> None:
    async def agent_loop() -> None:
        assert sbx is not None
        await sbx.files.write("/home/user/step.py", BROKEN)
        try:
            await sbx.commands.run("python3 /home/user/step.py")
            raise AssertionError("the broken script exited 0")
        except CommandExitException as e:
            assert e.exit_code == 1, e.exit_code
            assert "SyntaxError" in e.stderr, e.stderr
        await sbx.files.write("/home/user/step.py", FIXED)
        fixed = await sbx.commands.run("python3 /home/user/step.py")
        assert fixed.exit_code == 0 and fixed.stdout == '{"answer": 42}\n', fixed

    async def commands() -> None:
        assert sbx is not None
        who = await sbx.commands.run("whoami; pwd")
        assert who.stdout.split() == ["user", "/home/user"], who.stdout
        root = await sbx.commands.run("whoami", user="root")
        assert root.stdout.strip() == "root", root
        try:
            await sbx.commands.run("echo out; echo err >&2; exit 3")
            raise AssertionError("exit 3 raised nothing")
        except CommandExitException as e:
            assert (e.exit_code, e.stdout, e.stderr) == (3, "out\n", "err\n"), e
        env = await sbx.commands.run("echo $GREETING", envs={"GREETING": "hi"}, cwd="/tmp")
        assert env.stdout == "hi\n", env.stdout

    async def background() -> None:
        assert sbx is not None
        seen: list[str] = []
        three = asyncio.Event()

        def on_stdout(chunk: str) -> None:
            seen.append(chunk)
            if "".join(seen).count("tick") >= 3:
                three.set()

        handle = await sbx.commands.run(TICKS, background=True, on_stdout=on_stdout)
        # The ticks arrive while the command still runs (it sleeps 300 s after them).
        await asyncio.wait_for(three.wait(), 60)
        assert "".join(seen) == "tick 1\ntick 2\ntick 3\n", seen
        listed = [p.pid for p in await sbx.commands.list()]
        assert handle.pid in listed, (handle.pid, listed)
        assert await sbx.commands.kill(handle.pid) is True
        try:
            await handle.wait()
            raise AssertionError("a killed command exited 0")
        except CommandExitException as e:
            assert e.exit_code != 0
        assert handle.pid not in [p.pid for p in await sbx.commands.list()]

    async def files() -> None:
        assert sbx is not None
        assert await sbx.files.make_dir("/home/user/d/sub") is True
        await sbx.files.write("/home/user/d/a.txt", "alpha")
        await sbx.files.write("/home/user/d/b.bin", b"\x00\x01\xff")
        assert await sbx.files.read("/home/user/d/a.txt") == "alpha"
        got = await sbx.files.read("/home/user/d/b.bin", format="bytes")
        assert bytes(got) == b"\x00\x01\xff", got
        names = sorted(e.name for e in await sbx.files.list("/home/user/d"))
        assert names == ["a.txt", "b.bin", "sub"], names
        assert await sbx.files.exists("/home/user/d/a.txt")
        moved = await sbx.files.rename("/home/user/d/a.txt", "/home/user/d/sub/c.txt")
        assert moved.path == "/home/user/d/sub/c.txt", moved
        assert not await sbx.files.exists("/home/user/d/a.txt")
        assert await sbx.files.read("/home/user/d/sub/c.txt") == "alpha"
        await sbx.files.remove("/home/user/d/sub")
        assert not await sbx.files.exists("/home/user/d/sub/c.txt")
        owner = (await sbx.commands.run("stat -c %U /home/user/d/b.bin")).stdout.strip()
        assert owner == "user", owner

    async def run_code() -> None:
        assert sbx is not None
        first = await sbx.run_code("x = 41")
        assert first.error is None, first.error
        second = await sbx.run_code("x + 1")
        assert second.text == "42", second
        printed = await sbx.run_code("print('hello')")
        assert printed.logs.stdout == ["hello\n"], printed.logs
        failed = await sbx.run_code("1 / 0")
        assert failed.error is not None and failed.error.name == "ZeroDivisionError", failed

    async def stdin_reconnect() -> None:
        assert sbx is not None
        first_out: list[str] = []
        first = await sbx.commands.run("cat", background=True, stdin=True,
                                       on_stdout=first_out.append)
        await sbx.commands.send_stdin(first.pid, "one\n")
        await until(lambda: "one\n" in "".join(first_out), "one echoed")
        assert "".join(first_out) == "one\n", first_out
        await first.disconnect()
        again_out: list[str] = []
        again = await sbx.commands.connect(first.pid, on_stdout=again_out.append)
        await sbx.commands.send_stdin(first.pid, "two\n")
        await until(lambda: "two\n" in "".join(again_out), "two echoed")
        # Ours replays the output the guest holds first (envd/process.py), where E2B's
        # daemon sends only what comes after.
        assert "".join(again_out) in ("two\n", "one\ntwo\n"), again_out
        await sbx.commands.close_stdin(first.pid)
        assert (await again.wait()).exit_code == 0

    async def watch() -> None:
        assert sbx is not None
        await sbx.files.make_dir("/home/user/w")
        names: list[str] = []
        handle = await sbx.files.watch_dir("/home/user/w", on_event=lambda e: names.append(e.name))
        await sbx.files.write("/home/user/w/new.txt", "x")
        await until(lambda: "new.txt" in names, "a watch event for new.txt")
        await handle.stop()

    async def pty() -> None:
        assert sbx is not None
        seen: list[bytes] = []
        term = await sbx.pty.create(PtySize(rows=24, cols=80), on_data=seen.append)
        await sbx.pty.send_stdin(term.pid, b"echo pty-$((6*7))\n")
        await until(lambda: b"pty-42" in b"".join(seen), "pty-42 on the terminal")
        await sbx.pty.resize(term.pid, PtySize(rows=30, cols=100))
        await sbx.pty.send_stdin(term.pid, b"stty size; exit 3\n")
        try:
            await term.wait()
            raise AssertionError("exit 3 raised nothing")
        except CommandExitException as e:
            assert e.exit_code == 3, e.exit_code
        assert b"30 100" in b"".join(seen), seen

    async def png() -> None:
        assert sbx is not None
        drawn = await sbx.run_code(
            "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
        pngs = [r.png for r in drawn.results if r.png]
        assert pngs and base64.b64decode(pngs[0]).startswith(b"\x89PNG"), drawn

    async def fork() -> None:
        assert sbx is not None
        await sbx.files.write("/home/user/forked.txt", "from the parent")
        kids = await sbx.fork(count=1)
        try:
            assert len(kids) == 1 and not isinstance(kids[0], Exception), kids
            kid = kids[0]
            report.made.append(kid.sandbox_id)
            assert kid.sandbox_id != sbx.sandbox_id
            assert await kid.files.read("/home/user/forked.txt") == "from the parent"
            await kid.files.write("/home/user/forked.txt", "from the child")
            assert await sbx.files.read("/home/user/forked.txt") == "from the parent"
        finally:
            for kid in kids:
                if not isinstance(kid, Exception):
                    await kid.kill()

    async def list_metadata() -> None:
        assert sbx is not None
        found = await AsyncSandbox.list(query=SandboxQuery(metadata=metadata)).next_items()
        assert [s.sandbox_id for s in found] == [sbx.sandbox_id], found
        other = AsyncSandbox.list(query=SandboxQuery(metadata={"run": "none-" + metadata["run"]}))
        assert await other.next_items() == []

    async def timeout() -> None:
        assert sbx is not None
        before = (await sbx.get_info()).end_at
        asked = time.time()
        await sbx.set_timeout(1200)
        answered = time.time()
        after = (await sbx.get_info()).end_at
        # 1200 s from the call (server and client share this machine's clock); measured from
        # the create's 300 s the move depends on how long the steps before took (a loaded
        # host's 250 s read as a failure).
        assert asked + 1140 < after.timestamp() < answered + 1260, (asked, before, after)

    async def pause_resume() -> None:
        assert sbx is not None
        await sbx.files.write("/home/user/keep.txt", "kept")
        sleeper = await sbx.commands.run("sleep 600", background=True)
        assert await sbx.pause() is True
        assert str((await AsyncSandbox.get_info(sbx.sandbox_id)).state) == "paused"
        resumed = await AsyncSandbox.connect(sbx.sandbox_id, timeout=300)
        assert await resumed.files.read("/home/user/keep.txt") == "kept"
        # Hibernation keeps memory: the process started before the pause still runs.
        assert sleeper.pid in [p.pid for p in await resumed.commands.list()]
        assert (await resumed.commands.run("echo back")).stdout == "back\n"
        assert str((await AsyncSandbox.get_info(sbx.sandbox_id)).state) == "running"

    async def kill() -> None:
        assert sbx is not None
        assert await sbx.kill() is True
        left = await AsyncSandbox.list(query=SandboxQuery(metadata=metadata)).next_items()
        assert left == [], left

    async def gone() -> None:
        assert sbx is not None
        assert not await sbx.is_running()

    for name, body in (("agent_loop", agent_loop), ("commands", commands),
                       ("background", background), ("files", files),
                       ("stdin_reconnect", stdin_reconnect), ("watch", watch), ("pty", pty),
                       ("run_code", run_code), ("png", png), ("fork", fork),
                       ("list_metadata", list_metadata), ("timeout", timeout),
                       ("pause_resume", pause_resume), ("kill", kill)):
        await run_async(report, name, body)
    await run_async(report, "gone", gone, needs=("kill",))


async def until(done: object, what: str, seconds: float = 30) -> None:
    """Until `done()` holds, the SDK's callbacks running meanwhile; at most `seconds`."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not done():  # type: ignore[operator]
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"no {what} in {seconds} s")
        await asyncio.sleep(0.05)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
