"""Opening a connection to the agent (spec/guest-protocol.md §3): the hello with a fresh nonce,
resync past whatever the stream held before it, padding when no reply comes, and the `init`
request that may ride in the same write. Until it returns, the connection's bytes are read
here (scanning for the one reply that counts); after it, by the channel's reader task."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pandastack.guestproto import frames as P
from pandastack.guestproto.ops import ENTROPY_BYTES
from pandastack.hostport.errors import AgentConnectionError

HELLO_RETRY = 2.0
"""If the hello is not answered this soon, pad (complete any half-read frame) and retry."""
MAX_RESYNC_BYTES = 64 * 2**20
"""Handshake gives up after discarding this many bytes that are not our hello reply."""
READ_SIZE = 1 << 20
"""Bytes asked of the agent's stream per read (here and by the channel's reader)."""


@dataclass(frozen=True)
class InitParams:
    """What makes a restored guest unique: sent on every restore."""

    time_ns: int
    entropy: bytes
    hostname: str
    machine_id: str

    def __post_init__(self) -> None:
        if len(self.entropy) != ENTROPY_BYTES:
            raise ValueError(f"entropy must be exactly {ENTROPY_BYTES} bytes")

    def fields(self) -> dict[str, Any]:
        return {"time_ns": self.time_ns, "hostname": self.hostname,
                "machine_id": self.machine_id}

    def frame(self, op_id: int) -> bytes:
        """The `init` request as it goes on the wire, with the entropy as its payload."""
        return P.encode({"t": "init", "id": op_id, **self.fields()}, self.entropy)


@dataclass(frozen=True)
class Hello:
    """What the agent's hello reply says of it."""

    agent_version: str | None
    pid: int | None


def hello_frame(nonce: str) -> bytes:
    return P.frame("hello", 0, v=P.PROTOCOL_VERSION, nonce=nonce)


async def handshake(
    reader: asyncio.StreamReader,
    write: Callable[[bytes], Awaitable[None]],
    decoder: P.FrameDecoder,
    preamble: bytes = b"",
) -> Hello:
    """Say hello (``preamble`` follows it in the same write) and wait for the reply to it.
    Bytes after the reply stay in ``decoder``. Not bounded in time: the caller's deadline is."""
    nonces = [secrets.token_hex(16)]

    def accept(f: P.Frame) -> bool:
        return f.id == 0 and f.t in ("hello", "error") and f.header.get("nonce") == nonces[-1]

    await write(hello_frame(nonces[-1]) + preamble)
    pad_at = time.monotonic() + HELLO_RETRY
    while True:
        f = decoder.scan(accept)
        if f is not None:
            break
        if decoder.discarded > MAX_RESYNC_BYTES:
            raise AgentConnectionError(
                f"no hello reply in the first {MAX_RESYNC_BYTES} bytes from the agent"
            )
        try:
            if len(nonces) == 1:
                async with asyncio.timeout(max(0.0, pad_at - time.monotonic())):
                    data = await reader.read(READ_SIZE)
            else:
                data = await reader.read(READ_SIZE)
        except TimeoutError:
            # The agent may be stuck inside a frame a dead host left half-written:
            # zeros complete any frame and then break its sync, so it rescans for a
            # hello; only the reply to the new nonce counts from now on.
            nonces.append(secrets.token_hex(16))
            await write(bytes(P.MAX_FRAME + P.PREFIX_SIZE) + hello_frame(nonces[-1]) + preamble)
            continue
        if not data:
            raise AgentConnectionError("agent channel closed during handshake")
        decoder.feed(data)
    if f.t == "error":
        raise AgentConnectionError(f"agent refused hello: {f.header.get('message')}")
    if f.header.get("v") != P.PROTOCOL_VERSION:
        raise AgentConnectionError(f"agent speaks protocol {f.header.get('v')!r}")
    version, pid = f.header.get("agent_version"), f.header.get("pid")
    return Hello(version if isinstance(version, str) else None,
                 pid if isinstance(pid, int) else None)
