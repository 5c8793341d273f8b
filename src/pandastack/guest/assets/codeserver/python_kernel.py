"""Python contexts: one ipykernel kernel each, driven through jupyter_client (imported when the
first python context starts, so bash and javascript need only the standard library)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

from . import protocol
from .protocol import INTERRUPT_GRACE, KERNEL_START_TIMEOUT, SLICE, Context, Run

# --- python --------------------------------------------------------------------------------


def _bundle(data: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for mime, value in data.items():
        if isinstance(value, str):
            # base64 image data may carry line breaks; consumers want the bare payload
            out[mime] = "".join(value.split()) if mime.startswith("image/") and \
                not mime.startswith("image/svg") else value
        else:
            out[mime] = json.dumps(value)
    return out


class PythonContext(Context):
    language = "python"

    def __init__(self, ctx_id: str, cwd: str) -> None:
        super().__init__(ctx_id, cwd)
        self.km: Any = None
        self.kc: Any = None

    async def start(self) -> None:
        from jupyter_client.manager import (  # type: ignore[import-not-found,unused-ignore]
            AsyncKernelManager,
        )

        # Unix sockets (in JUPYTER_RUNTIME_DIR) rather than TCP ports on loopback.
        runtime = os.environ.get("JUPYTER_RUNTIME_DIR") or protocol.RUN_DIR
        os.makedirs(runtime, mode=0o700, exist_ok=True)
        km = AsyncKernelManager(kernel_name="python3", transport="ipc",
                                ip=os.path.join(runtime, f"kernel-{self.id}"),
                                connection_file=os.path.join(runtime, f"kernel-{self.id}.json"))
        # No SQLite history: no background writer thread and no file shared by forks.
        await km.start_kernel(cwd=self.cwd, extra_arguments=["--HistoryManager.enabled=False"])
        kc = km.client()
        kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=KERNEL_START_TIMEOUT)
        except BaseException:
            kc.stop_channels()
            with contextlib.suppress(Exception):
                await km.shutdown_kernel(now=True)
            raise
        self.km, self.kc = km, kc

    async def stop(self) -> None:
        kc, km, self.kc, self.km = self.kc, self.km, None, None
        if kc is not None:
            kc.stop_channels()
        if km is not None:
            with contextlib.suppress(Exception):
                await km.shutdown_kernel(now=True)

    async def _restart_dead(self) -> None:
        await self.stop()
        await self.start()

    async def _silent(self, code: str) -> None:
        """Run bookkeeping code that leaves no trace in the history or the output."""
        msg_id = self.kc.execute(code, silent=True, store_history=False, allow_stdin=False)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                msg = await self.kc.get_shell_msg(timeout=SLICE)
                if msg["parent_header"].get("msg_id") == msg_id:
                    return
            if not await self.km.is_alive():
                return

    async def execute(self, code: str, run: Run, env: dict[str, str] | None,
                      store_history: bool) -> int | None:
        if self.km is None or not await self.km.is_alive():
            await self._restart_dead()
        if env:
            await self._silent(
                "_pandastack_env_saved = {k: __import__('os').environ.get(k) for k in "
                f"{sorted(env)!r}}}; __import__('os').environ.update({env!r})")
        try:
            return await self._execute(code, run, store_history)
        finally:
            if env and self.km is not None and await self.km.is_alive():
                await self._silent(
                    "(lambda o, s: [o.environ.pop(k, None) if v is None else "
                    "o.environ.__setitem__(k, v) for k, v in s.items()])"
                    "(__import__('os'), _pandastack_env_saved); del _pandastack_env_saved")

    async def _execute(self, code: str, run: Run, store_history: bool) -> int | None:
        kc, out = self.kc, run.out
        msg_id = kc.execute(code, store_history=store_history, allow_stdin=False,
                            stop_on_error=False)
        count: int | None = None
        stopped: str | None = None  # why we interrupted the kernel
        stopped_at = 0.0
        idle = False
        while not idle:
            if stopped is None:
                stopped = run.stop_reason()
                if stopped is not None:
                    stopped_at = time.monotonic()
                    with contextlib.suppress(Exception):
                        await self.km.interrupt_kernel()
            elif time.monotonic() - stopped_at > INTERRUPT_GRACE:
                await self._restart_dead()
                await run.stopped(stopped, "; the kernel did not stop when interrupted and was "
                                  "restarted: its state is lost")
                return None
            try:
                msg = await kc.get_iopub_msg(timeout=SLICE)
            except Exception:  # queue.Empty: nothing arrived in this slice
                if not await self.km.is_alive():
                    await self._restart_dead()
                    await out.error("DeadKernelError", "the kernel died while running the code; "
                                    "it was restarted and its state is lost")
                    return None
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "status":
                idle = content.get("execution_state") == "idle"
            elif kind == "execute_input":
                count = content.get("execution_count", count)
            elif kind == "stream":
                await out.text("stderr" if content.get("name") == "stderr" else "stdout",
                               str(content.get("text", "")))
            elif kind in ("execute_result", "display_data", "update_display_data"):
                await out.result(_bundle(content.get("data") or {}),
                                 kind == "execute_result")
            elif kind == "error":
                traceback = "\n".join(str(t) for t in content.get("traceback") or ())
                if stopped is not None and content.get("ename") == "KeyboardInterrupt":
                    await run.stopped(stopped, "; the kernel was interrupted and keeps its state",
                                      traceback)
                else:
                    await out.error(str(content.get("ename", "Error")),
                                    str(content.get("evalue", "")), traceback)
        # The reply was sent before the idle status: take it, so replies never pile up.
        with contextlib.suppress(Exception):
            while True:
                reply = await kc.get_shell_msg(timeout=5 if count is None else 0.05)
                if reply["parent_header"].get("msg_id") == msg_id:
                    count = reply["content"].get("execution_count", count)
                    break
        return count if store_history else None
