"""E2B's `process.Process` service (envd/process/process.proto) over our processes."""

from __future__ import annotations

from starlette.requests import Request

from pandastack.server.errors import clean_text

from ..target import target_of
from .connect import Message, Method, Unary


async def list_processes(request: Request, message: Message) -> Message:
    target = target_of(request)
    _, handle = await target.service.running(target.team, target.sandbox_id)
    processes = []
    for item in await target.service.host_call(handle.procs()):
        pid = item.get("pid")
        if not isinstance(pid, int) or not item.get("running"):
            continue
        cmd = item.get("cmd")
        processes.append({"pid": pid, "config": {
            "cmd": clean_text(cmd if isinstance(cmd, str) else str(cmd)), "args": [],
            "envs": {}}})
    return {"processes": processes}


METHODS: dict[str, Method] = {
    "List": Unary(list_processes),
}
