"""`python -m pandastack.cli.main ...` as a process of its own, forked from one interpreter
that has imported the CLI once. A test that runs the CLI tens of times otherwise pays the
interpreter's start and the CLI's imports on every call (~0.6 s of each ~0.7 s call on this
machine, measured). Each call is still a new process that runs the module as `python -m`
does: runpy executes it as `__main__` with the call's argv, on its own stdin, stdout and
stderr, in the environment the runner was started with, and its exit status is the call's.
What a fresh interpreter adds (the CLI importing at all) is checked by every plain
subprocess call in tests/e2e/test_cli.py."""

from __future__ import annotations

import json
import selectors
import subprocess
import sys
from collections.abc import Mapping
from types import TracebackType

from tests.leftovers import owned_tmpdir

MODULE = "pandastack.cli.main"
# The forking server. A child ends with os._exit so that nothing the server holds (its
# request pipe, atexit hooks) runs twice; it flushes its own streams first.
SERVER = f"""
import json, os, runpy, select, signal, sys, traceback
import {MODULE}
# The imports every call would pay: main imports only the command it runs, so load them all
# here once (main run afresh finds them in sys.modules).
for name in {MODULE}.COMMAND_MODULES:
    {MODULE}.load_command(name)

def call(req):
    for fd, (path, flags) in enumerate(((req["stdin"], os.O_RDONLY),
                                        (req["stdout"], os.O_WRONLY),
                                        (req["stderr"], os.O_WRONLY))):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    sys.argv = ["-m", *req["argv"]]
    del sys.modules["{MODULE}"]  # run afresh as __main__, as `python -m` does
    code = 0
    try:
        runpy.run_module("{MODULE}", run_name="__main__", alter_sys=True)
    except SystemExit as stop:  # the interpreter's rules for sys.exit's argument
        if stop.code is None:
            code = 0
        elif isinstance(stop.code, int):
            code = stop.code
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code

for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = call(req)
        finally:
            os._exit(code)
    waiter = os.pidfd_open(pid)
    if not select.select([waiter], [], [], req["timeout"])[0]:
        os.kill(pid, signal.SIGKILL)
    os.close(waiter)
    _, status = os.waitpid(pid, 0)
    print(json.dumps(os.waitstatus_to_exitcode(status)), flush=True)
"""


class ForkedCLI:
    """Runs `pandastack <argv>` calls one at a time; a context manager around its server."""

    def __init__(self, env: Mapping[str, str], timeout: float = 120) -> None:
        self.timeout = timeout
        self._dir = owned_tmpdir("pscli-")
        self._server = subprocess.Popen([sys.executable, "-c", SERVER], env=dict(env),
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._calls = 0

    def __enter__(self) -> ForkedCLI:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        assert self._server.stdin is not None
        self._server.stdin.close()  # the server's loop ends at end of input
        try:
            self._server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._server.kill()
            self._server.wait()
        if self._server.stdout is not None:
            self._server.stdout.close()
        for path in self._dir.iterdir():
            path.unlink()
        self._dir.rmdir()

    def __call__(self, *argv: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        self._calls += 1
        paths = {name: self._dir / f"{self._calls}.{name}" for name in ("in", "out", "err")}
        paths["in"].write_text(stdin)
        paths["out"].touch()
        paths["err"].touch()
        request = {"argv": list(argv), "stdin": str(paths["in"]),
                   "stdout": str(paths["out"]), "stderr": str(paths["err"]),
                   "timeout": self.timeout}
        assert self._server.stdin is not None and self._server.stdout is not None
        self._server.stdin.write(json.dumps(request).encode() + b"\n")
        self._server.stdin.flush()
        with selectors.DefaultSelector() as sel:
            sel.register(self._server.stdout, selectors.EVENT_READ)
            answered = sel.select(self.timeout + 30)
        assert answered, f"the forked CLI server did not answer for {argv}"
        line = self._server.stdout.readline()
        assert line, f"the forked CLI server died (exit {self._server.poll()}) on {argv}"
        done = subprocess.CompletedProcess(
            [sys.executable, "-m", MODULE, *argv], json.loads(line),
            paths["out"].read_text(), paths["err"].read_text())
        for path in paths.values():
            path.unlink()
        return done
