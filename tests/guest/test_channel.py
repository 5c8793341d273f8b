"""Unit tests of the agent's byte stream (pandastack.guest.channel) over a socketpair."""

from __future__ import annotations

import os
import socket
import threading

from pandastack.guest.channel import READ_SIZE, SocketChannel, VirtioChannel


def test_socket_reads_do_not_share_the_reused_buffer() -> None:
    ours, theirs = socket.socketpair()
    chan = SocketChannel(theirs.detach())
    try:
        ours.sendall(b"first")
        first = chan.read()
        ours.sendall(b"SECOND-LONGER")
        second = chan.read()
        assert (first, second) == (b"first", b"SECOND-LONGER")
        ours.close()
        assert chan.read() == b""
    finally:
        chan.close()


def test_a_read_returns_at_most_read_size() -> None:
    ours, theirs = socket.socketpair()
    chan = SocketChannel(theirs.detach())
    try:
        # More than a socket buffer holds: the writer runs beside the reads.
        writer = threading.Thread(target=ours.sendall, args=(b"z" * (READ_SIZE + 10),))
        writer.start()
        got = chan.read()
        assert 0 < len(got) <= READ_SIZE
        rest = b""
        while len(got) + len(rest) < READ_SIZE + 10:
            rest += chan.read()
        assert got + rest == b"z" * (READ_SIZE + 10)
        writer.join(10)
    finally:
        ours.close()
        chan.close()


def test_virtio_reads_copy_out_of_the_buffer(tmp_path: os.PathLike[str]) -> None:
    # A FIFO stands in for the port's character device: the same os.open/readv calls.
    fifo = os.path.join(tmp_path, "port")
    os.mkfifo(fifo)
    chan = VirtioChannel(fifo)
    writer = os.open(fifo, os.O_WRONLY)
    try:
        os.write(writer, b"one")
        first = chan.read()
        os.write(writer, b"two-two")
        assert (first, chan.read()) == (b"one", b"two-two")
    finally:
        os.close(writer)
        chan.close()
