"""The `code` op: relay one request to the code interpreter's unix socket, stream its answer.

The interpreter (kernel_server.py, installed by images that have one) speaks newline-delimited
JSON; the agent does not interpret it beyond checking that the request is one JSON object.
Its answer travels back as `data` frames (credit-controlled, so a slow host stops the
interpreter's writes instead of filling the agent's memory), then `eof`. Cancelling the op
closes the connection, which the interpreter treats as "interrupt this run".
"""

from __future__ import annotations

import contextlib
import json
import socket

from pandastack.guestproto.frames import MAX_JSON_DEPTH, Frame, parse_json

from .ops import Handler, Op, OpError

SOCKET_PATH = "/run/pandastack/code.sock"
READ_SIZE = 256 * 1024
CONNECT_TIMEOUT = 10.0


def _request_line(payload: bytes) -> bytes:
    try:
        # UTF-8 only (json.loads would guess UTF-16 or a BOM from bytes; the binary agent does not).
        req = parse_json(payload.decode("utf-8"), max_depth=MAX_JSON_DEPTH)
    except ValueError:
        raise OpError("EINVAL", "code request payload is not JSON") from None
    if not isinstance(req, dict) or not isinstance(req.get("op"), str):
        raise OpError("EINVAL", "code request must be a JSON object with an 'op'")
    # Compact JSON has no raw newline: the request is exactly one line.
    return json.dumps(req, separators=(",", ":")).encode() + b"\n"


def code(op: Op, f: Frame, socket_path: str) -> None:
    line = _request_line(f.payload)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT)
        try:
            sock.connect(socket_path)
        except FileNotFoundError:
            raise OpError("code_unavailable",
                          "this sandbox's template has no code interpreter") from None
        except (ConnectionRefusedError, TimeoutError) as e:
            raise OpError("code_unavailable",
                          f"the code interpreter is not running ({e})") from None
        sock.settimeout(None)
        sock.sendall(line)

        def on_cancel(_op: Op) -> None:
            # Runs on the reader thread: only wake the recv below, never block.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

        op.set_handlers(lambda fr: None, on_cancel)
        total = 0
        buf = memoryview(bytearray(READ_SIZE))  # one buffer, not an mmap per recv (channel.py)
        while True:
            try:
                data = bytes(buf[:sock.recv_into(buf)])
            except OSError:
                data = b""
            if not data or op.cancelled.is_set():
                break
            if not op.send_data("data", data):
                return
            total += len(data)
        if not op.cancelled.is_set():
            op.send("eof", size=total)
    finally:
        sock.close()


#: The requests this module answers (the agent's dispatch table is made of these).
HANDLERS: dict[str, Handler] = {
    "code": lambda a, op, f: code(op, f, a.code_socket),
}
