"""Talking to a QEMU that is starting or running over QMP (the unix-socket connect is the
driver's generic `connect_unix`).

The create path speaks QMP's line protocol directly (`qmp_pipeline`, one round trip); the rest
uses the `qemu.qmp` client library (`connect_qmp`).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from qemu.qmp import QMPClient

from pandastack.host.vmm.driver import VMPaths, connect_unix, log_tail
from pandastack.hostport.errors import VMMError

QMP_TIMEOUT_S = 30.0
# How long `connect_qmp` retries a socket that refuses (a VMM starting, or one that died):
# read at each call, so a test of a dead VMM's path can shorten it (the product keeps 30 s).
QMP_CONNECT_S = QMP_TIMEOUT_S


def qmp_socket(paths: VMPaths) -> Path:
    return paths.workdir / "qmp.sock"


def send_fd(qmp: QMPClient, fd: int) -> None:
    """Hand QEMU the descriptor `fd` (SCM_RIGHTS) for its next `getfd`/`add-fd`.

    `QMPClient.send_fd_scm` reaches into asyncio's own socket wrapper (`._sock`), which
    uvloop's transports do not have: under uvicorn's default loop, where uvloop is
    installed (`uvicorn[standard]`), every save and disk switch of `pandastack serve`
    failed with an AttributeError. There it goes through a duplicate of the socket."""
    try:
        qmp.send_fd_scm(fd)
    except AttributeError:
        send_fd_on(qmp._writer.transport.get_extra_info("socket"), fd)  # type: ignore[union-attr]


def send_fd_on(transport_socket: Any, fd: int) -> None:
    """`fd` over the unix socket a transport reports (`get_extra_info("socket")`), whatever
    the event loop's wrapper of it: a duplicate of its descriptor sends it, with the one
    byte QEMU's QMP reads along with a descriptor."""
    with socket.socket(fileno=os.dup(transport_socket.fileno())) as dup:
        dup.sendmsg([b" "], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("@i", fd))])


async def qmp_pipeline(socket_path: Path, commands: list[tuple[str, dict[str, Any]]], *,
                       alive: Callable[[], bool], timeout: float = QMP_TIMEOUT_S) -> None:
    """Connect to a fresh QMP socket, negotiate, and run `commands` in one write.

    The full client library costs a round trip per command; on the create path every
    millisecond counts, so this speaks the line protocol directly. Events are skipped.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    sock = await connect_unix(socket_path, alive=alive, timeout=timeout)
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    try:
        lines: list[dict[str, Any]] = [{"execute": "qmp_capabilities"}]
        lines += [{"execute": name, "arguments": args} for name, args in commands]
        writer.write(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
        await writer.drain()
        answered = 0
        while answered < len(lines):
            raw = await asyncio.wait_for(reader.readline(), max(0.1, deadline - loop.time()))
            if not raw:
                raise VMMError(f"QMP closed early: {log_tail(socket_path)}")
            message = json.loads(raw)
            if "error" in message:
                raise VMMError(f"QMP {lines[answered]['execute']}: {message['error']}")
            if "return" in message:
                answered += 1
    except (TimeoutError, ValueError) as exc:
        raise VMMError(f"QMP did not answer: {exc}") from exc
    finally:
        writer.close()


async def connect_qmp(socket: Path, timeout: float | None = None) -> QMPClient:
    client = QMPClient("pandastack")
    deadline = asyncio.get_running_loop().time() + (QMP_CONNECT_S if timeout is None
                                                    else timeout)
    while True:
        try:
            await asyncio.wait_for(client.connect(str(socket)), timeout=5)
            return client
        except (TimeoutError, OSError, Exception) as exc:  # qemu.qmp wraps OSErrors
            if asyncio.get_running_loop().time() > deadline:
                raise VMMError(f"QMP at {socket} did not answer: {exc}") from exc
            await asyncio.sleep(0.02)


async def wait_migration(qmp: QMPClient, timeout: float = QMP_TIMEOUT_S,
                         poll_s: float = 0.005, *, what: str = "migration",
                         on_poll: Callable[[float], Awaitable[None]] | None = None
                         ) -> dict[str, Any]:
    """Poll `query-migrate` until the migration (a save, a restore, a move; `what` in the
    errors) completes: its last answer. `on_poll(elapsed_s)` runs after each answer that is
    not the end (a move stops a guest that does not converge there)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while True:
        info = await qmp.execute("query-migrate")
        if not isinstance(info, dict):
            raise VMMError(f"unexpected query-migrate answer: {info!r}")
        status = info.get("status")
        if status == "completed":
            return info
        if status in ("failed", "cancelled"):
            raise VMMError(f"{what} {status}: {info.get('error-desc', '')}")
        elapsed = loop.time() - started
        if elapsed > timeout:
            raise VMMError(f"{what} did not complete in {timeout}s (status {status})")
        if on_poll is not None:
            await on_poll(elapsed)
        await asyncio.sleep(poll_s)
