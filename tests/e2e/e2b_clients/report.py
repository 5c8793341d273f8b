"""The step record the E2B client scripts write (one JSON object a line, to the file named by
their first argument): the test reads one outcome per step, so a missing part of the E2B room
fails the steps that need it and no others. Runs under the SDK's own venv: stdlib only."""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO


class Report:
    def __init__(self, out: TextIO) -> None:
        self._out = out
        self.failed: set[str] = set()
        # Every sandbox a step made: the test checks each has ended after the script.
        self.made: list[str] = []

    def write(self, step: str, ok: bool, error: str = "", **detail: Any) -> None:
        self._out.write(json.dumps({"step": step, "ok": ok, "error": error, **detail}) + "\n")
        self._out.flush()

    @contextmanager
    def step(self, name: str, needs: tuple[str, ...] = ("create",)) -> Iterator[None]:
        """One step: ok if its block returns, else its first error line and where it was
        raised; a step whose prerequisite failed is recorded as such and not run (`run`
        and `run_async` take the _Skip this raises)."""
        started = time.monotonic()
        missing = [n for n in needs if n in self.failed]
        if missing:
            self.failed.add(name)
            self.write(name, False, f"not run: {', '.join(missing)} failed")
            raise _Skip
        try:
            yield
        except AssertionError as e:
            self.failed.add(name)
            self.write(name, False, f"AssertionError: {e}", where=_where(e))
        except Exception as e:  # every SDK error is a step's outcome
            self.failed.add(name)
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            self.write(name, False, f"{type(e).__name__}: {first}"[:2000], where=_where(e))
        else:
            self.write(name, True, seconds=round(time.monotonic() - started, 2))
        finally:
            if self.made:
                self.write("_made", True, sandboxes=self.made)
                self.made = []


class _Skip(Exception):
    pass


def run(report: Report, name: str, body: Callable[[], None],
        needs: tuple[str, ...] = ("create",)) -> None:
    try:
        with report.step(name, needs):
            body()
    except _Skip:
        pass


async def run_async(report: Report, name: str, body: Callable[[], Any],
                    needs: tuple[str, ...] = ("create",)) -> None:
    try:
        with report.step(name, needs):
            await body()
    except _Skip:
        pass


def _where(e: BaseException) -> str:
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if f.filename.endswith(sys.argv[0].rsplit("/", 1)[-1])]
    f = (ours or frames)[-1] if frames else None
    return f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}" if f else ""
