"""Where a sparse file's data is: the ranges SEEK_DATA/SEEK_HOLE report. One walk for every
reader that skips holes (object-store uploads, snapshot transfers, volume copies)."""

from __future__ import annotations

import errno
import os


def data_ranges(fd: int, size: int) -> list[tuple[int, int]]:
    """(start, end) of each data range within the first `size` bytes of the open file `fd`;
    the whole as one range where the file system cannot tell holes apart."""
    ranges: list[tuple[int, int]] = []
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole is left
                break
            if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
                return [(offset, size)]
            raise
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        if end <= start:
            break
        ranges.append((start, end))
        offset = end
    return ranges
