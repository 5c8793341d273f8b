"""Copy-on-write disk layers.

A sandbox's disk is an empty qcow2 overlay whose backing file is its template's disk. Creating
one is on the create path, and `qemu-img create` costs a fork+exec (~10 ms); an empty overlay is
four clusters of fixed structure, so we write it directly. `qemu-img check` in the tests keeps
this honest.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

QCOW2_MAGIC = 0x514649FB
CLUSTER_BITS = 16
CLUSTER = 1 << CLUSTER_BITS
HEADER_LENGTH = 104
EXT_BACKING_FORMAT = 0xE2792ACA
EXT_END = 0
REFCOUNT_ORDER = 4  # 16-bit refcounts, qemu's default

# Fixed layout: cluster 0 header, 1 refcount table, 2 refcount block, 3 L1 table.
REFCOUNT_TABLE_OFFSET = 1 * CLUSTER
REFCOUNT_BLOCK_OFFSET = 2 * CLUSTER
L1_OFFSET = 3 * CLUSTER


def _extension(kind: int, data: bytes) -> bytes:
    padded = data + b"\0" * (-len(data) % 8)
    return struct.pack(">II", kind, len(data)) + padded


def create_overlay(path: Path, backing: Path, size: int, backing_format: str = "qcow2", *,
                   relative: bool = False) -> None:
    """Write an empty qcow2 v3 image of `size` bytes backed by `backing`.

    With `relative`, the backing file is named relative to the overlay's own directory (it
    must be there): a chain of such layers resolves in any directory that holds links to
    all of them, which is how snapshots and forks share layers without copying them.
    """
    if relative:
        if backing.parent.resolve() != path.parent.resolve():
            raise ValueError("a relative backing file must sit next to the overlay")
        backing_name = backing.name.encode()
    else:
        backing_name = str(backing.resolve()).encode()
    l2_entries = CLUSTER // 8
    l1_size = -(-size // (l2_entries * CLUSTER))
    if l1_size * 8 > CLUSTER:
        raise ValueError("disk too large for a one-cluster L1 table")
    extensions = _extension(EXT_BACKING_FORMAT, backing_format.encode()) + _extension(EXT_END, b"")
    backing_offset = HEADER_LENGTH + len(extensions)
    if backing_offset + len(backing_name) > CLUSTER:
        raise ValueError("backing file path too long")
    header = struct.pack(
        ">IIQIIQIIQQIIQQQQII",
        QCOW2_MAGIC, 3, backing_offset, len(backing_name), CLUSTER_BITS, size,
        0,  # no encryption
        l1_size, L1_OFFSET, REFCOUNT_TABLE_OFFSET,
        1,  # refcount table clusters
        0, 0,  # no internal snapshots
        0, 0, 0,  # incompatible, compatible, autoclear features
        REFCOUNT_ORDER, HEADER_LENGTH,
    )
    assert len(header) == HEADER_LENGTH
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # the guest's data
    try:
        os.pwrite(fd, header + extensions + backing_name, 0)
        os.pwrite(fd, struct.pack(">Q", REFCOUNT_BLOCK_OFFSET), REFCOUNT_TABLE_OFFSET)
        os.pwrite(fd, struct.pack(">HHHH", 1, 1, 1, 1), REFCOUNT_BLOCK_OFFSET)
        os.ftruncate(fd, 4 * CLUSTER)
    finally:
        os.close(fd)
