"""Host work that only idle CPU time should pay for: memory prepared for later forks and
restores is not worth a running guest's CPU."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess


async def run_at_idle_priority(argv: list[str], what: str) -> None:
    """Run `argv` under SCHED_IDLE and wait for it; killed if the caller is cancelled.
    OSError naming `what`, with the end of its stderr, if it fails."""
    proc = await asyncio.create_subprocess_exec(
        "chrt", "--idle", "0", *argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _, err = await proc.communicate()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0:
        raise OSError(f"{what} failed (exit {proc.returncode}): {err.decode().strip()[-200:]}")


async def stop_idle_work(task: asyncio.Task[None] | None) -> None:
    """Cancel background preparation, if it is still running, and wait until it has ended."""
    if task is not None and not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
