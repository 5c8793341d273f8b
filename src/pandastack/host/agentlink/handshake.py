"""Opening a connection to the agent (spec/guest-protocol.md §3): the hello with a fresh nonce,
resync past whatever the stream held before it, padding when no reply comes, and the `init`
request that may ride in the same write. Until it returns, the connection's bytes are read
here (scanning for the one reply that counts); after it, by the channel's reader task."""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pandastack.guestproto import frames as P
from pandastack.guestproto.ops import ENTROPY_BYTES
from pandastack.hostport.errors import AgentConnectionError, GuestIncompatible

HELLO_RETRY = 2.0
"""If the hello is not answered this soon, pad (complete any half-read frame) and retry."""
MAX_RESYNC_BYTES = 64 * 2**20
"""Handshake gives up after discarding this many bytes that are not our hello reply."""
READ_SIZE = 1 << 20
"""Bytes asked of the agent's stream per read (here and by the channel's reader)."""
_WANT = re.compile(r"\(want (\d+)\)")


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
    """What the agent's hello reply says of it, and the guest protocol agreed on."""

    agent_version: str | None
    pid: int | None
    protocol: int = P.PROTOCOL_VERSION


def hello_frame(nonce: str, v: int = P.PROTOCOL_VERSION) -> bytes:
    return P.frame("hello", 0, v=v, nonce=nonce)


def refused_version(message: object) -> int | None:
    """The guest protocol an agent that refused our hello speaks, from its refusal's message
    (every agent so far ends it with "(want N)"; spec/guest-protocol.md §3)."""
    found = _WANT.search(message) if isinstance(message, str) else None
    return int(found.group(1)) if found else None


def incompatible(theirs: int | None, detail: str = "") -> GuestIncompatible:
    """The error for a guest agent that speaks guest protocol `theirs` (None: it did not say
    which; `detail` quotes what it said), which this host does not: what made the guest and
    what to do about it."""
    ours = f"this host speaks {P.OLDEST_PROTOCOL_VERSION} to {P.PROTOCOL_VERSION}"
    rebuild = ("rebuild the template (`pandastack template build NAME`, or `pandastack "
               "setup` for base and code-interpreter) and create the sandbox again from it")
    if theirs is None:
        return GuestIncompatible(
            f"the guest agent refused this host's guest protocol{detail} ({ours}): its "
            f"template, snapshot or hibernation was made by another pandastack version; "
            f"{rebuild}, or upgrade this host's agent if the template is newer")
    if theirs > P.PROTOCOL_VERSION:
        return GuestIncompatible(
            f"the guest agent speaks guest protocol {theirs}, newer than {ours}: its template, "
            f"snapshot or hibernation was made by a newer pandastack; upgrade this host's "
            f"agent")
    return GuestIncompatible(
        f"the guest agent speaks guest protocol {theirs}, older than {ours}: its template, or "
        f"the snapshot or hibernation it was restored from, was made by an older pandastack; "
        f"{rebuild}")


async def handshake(
    reader: asyncio.StreamReader,
    write: Callable[[bytes], Awaitable[None]],
    decoder: P.FrameDecoder,
    preamble: bytes = b"",
) -> Hello:
    """Say hello (``preamble`` follows it in the same write) and wait for the reply to it.
    An agent that refuses our guest protocol for an older one this host still speaks is
    greeted again in its own; one outside what this host speaks raises GuestIncompatible.
    Bytes after the reply stay in ``decoder``. Not bounded in time: the caller's deadline is."""
    offered = P.PROTOCOL_VERSION
    nonces = [secrets.token_hex(16)]
    await write(hello_frame(nonces[-1], offered) + preamble)
    while True:
        f = await _reply(reader, write, decoder, nonces, offered, preamble)
        if f.t != "error":
            break
        if f.header.get("code") != "EPROTONOSUPPORT":
            raise AgentConnectionError(f"agent refused hello: {f.header.get('message')}")
        theirs = refused_version(f.header.get("message"))
        if theirs is None or theirs == offered or not (
                P.OLDEST_PROTOCOL_VERSION <= theirs <= P.PROTOCOL_VERSION):
            raise incompatible(theirs, f" ({f.header.get('message')})")
        offered = theirs  # the older protocol it speaks, which this host speaks too
        nonces.append(secrets.token_hex(16))
        await write(hello_frame(nonces[-1], offered) + preamble)
    v = f.header.get("v")
    if type(v) is not int or not P.OLDEST_PROTOCOL_VERSION <= v <= P.PROTOCOL_VERSION:
        raise incompatible(v if type(v) is int else None, f" (its hello says v={v!r})")
    version, pid = f.header.get("agent_version"), f.header.get("pid")
    return Hello(version if isinstance(version, str) else None,
                 pid if isinstance(pid, int) else None, v)


async def _reply(reader: asyncio.StreamReader, write: Callable[[bytes], Awaitable[None]],
                 decoder: P.FrameDecoder, nonces: list[str], offered: int,
                 preamble: bytes) -> P.Frame:
    """The agent's reply (hello or error) to the hello of the newest nonce, resyncing and
    padding as §3 says (a new nonce is appended to `nonces` at each pad)."""
    pad_at = time.monotonic() + HELLO_RETRY
    padded = False

    def accept(f: P.Frame) -> bool:
        return f.id == 0 and f.t in ("hello", "error") and f.header.get("nonce") == nonces[-1]

    while True:
        f = decoder.scan(accept)
        if f is not None:
            return f
        if decoder.discarded > MAX_RESYNC_BYTES:
            raise AgentConnectionError(
                f"no hello reply in the first {MAX_RESYNC_BYTES} bytes from the agent"
            )
        try:
            if not padded:
                async with asyncio.timeout(max(0.0, pad_at - time.monotonic())):
                    data = await reader.read(READ_SIZE)
            else:
                data = await reader.read(READ_SIZE)
        except TimeoutError:
            # The agent may be stuck inside a frame a dead host left half-written:
            # zeros complete any frame and then break its sync, so it rescans for a
            # hello; only the reply to the new nonce counts from now on.
            padded = True
            nonces.append(secrets.token_hex(16))
            await write(bytes(P.MAX_FRAME + P.PREFIX_SIZE) + hello_frame(nonces[-1], offered)
                        + preamble)
            continue
        if not data:
            raise AgentConnectionError("agent channel closed during handshake")
        decoder.feed(data)
