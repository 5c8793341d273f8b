"""Content-addressed keys: an object's key is the sha256 of its bytes (64 lowercase hex
digits), so it never changes once written, any host may write it again, and a reader can
check what it got."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

HASH_CHUNK = 1 << 20
_KEY = re.compile(r"[0-9a-f]{64}")


def check_key(key: str) -> str:
    if not _KEY.fullmatch(key):
        raise ValueError(f"not an object key (sha256 in lowercase hex): {key!r}")
    return key


def sha256_of_file(path: Path) -> str:
    """The key of the file's bytes, read a chunk at a time (blocking)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_of_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
