"""A minimal DNS responder for tests (stdlib only): one name, one IPv4 answer.

Run inside a test namespace: python dns_stub.py BIND_ADDR NAME ANSWER_IP
"""

from __future__ import annotations

import socket
import struct
import sys


def answer(query: bytes, name: str, ip: str) -> bytes:
    tid, _flags, _qd = struct.unpack(">HHH", query[:6])
    i, labels = 12, []
    while query[i]:
        length = query[i]
        labels.append(query[i + 1:i + 1 + length].decode("ascii", "replace"))
        i += 1 + length
    qtype = struct.unpack(">H", query[i + 1:i + 3])[0]
    question = query[12:i + 5]
    if ".".join(labels).lower() != name:
        return struct.pack(">HHHHHH", tid, 0x8183, 1, 0, 0, 0) + question  # NXDOMAIN
    if qtype != 1:
        return struct.pack(">HHHHHH", tid, 0x8180, 1, 0, 0, 0) + question  # no such record
    record = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + socket.inet_aton(ip)
    return struct.pack(">HHHHHH", tid, 0x8180, 1, 1, 0, 0) + question + record


def main() -> None:
    bind, name, ip = sys.argv[1], sys.argv[2].lower().rstrip("."), sys.argv[3]
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((bind, 53))
    while True:
        data, peer = sock.recvfrom(512)
        try:
            sock.sendto(answer(data, name, ip), peer)
        except (IndexError, struct.error, UnicodeError):
            continue


if __name__ == "__main__":
    main()
