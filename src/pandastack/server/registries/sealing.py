"""The operator's key that encrypts team secrets at rest (registry passwords), and the sealing.

The key is 32 random bytes, base64 in a file of its own (`PANDASTACK_ENCRYPTION_KEY_FILE`,
default `<home>/encryption.key`), made by `pandastack setup`, mode 0600: the database alone
(a backup, a replica, a dump) never holds what it takes to read the passwords. Each value is
sealed with AES-256-GCM, a random 96-bit nonce, and the row it belongs to as associated data
(`context`): a sealed password copied into another team's row or another registry's does not
open. Considered: Fernet (AES-128-CBC + HMAC, from the same `cryptography` package) does
not bind associated data; a KMS or Vault is a deployment of its own (a later key source can
stand beside the file: rows record which key sealed them, `key_id`).

A server whose key file is missing still serves; storing credentials answers 503 naming the
command to run (`missing_key_message`), and a build that needs stored ones fails the same way.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import os
import stat
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_BYTES = 32
NONCE_BYTES = 12
SEALED_PREFIX = "v1."
KEY_FILE_NAME = "encryption.key"


class KeyFileError(ValueError):
    """The key file is missing, unreadable, too open or not a key (the message says which
    and what to do)."""


class UnsealError(Exception):
    """A sealed value does not open with this key (another key sealed it, or it was
    altered)."""


def missing_key_message(path: Path) -> str:
    return (f"no encryption key at {path}: run `pandastack setup` (it makes the key, mode "
            "0600; PANDASTACK_ENCRYPTION_KEY_FILE names another path), then restart the "
            "server; every API server of a cluster needs the same key file")


def make_key_file(path: Path) -> bool:
    """Write a new random key to `path` (mode 0600) unless a file is there already; True when
    it made one. Never overwrites: a new key would leave every sealed value unreadable."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return False
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, base64.b64encode(os.urandom(KEY_BYTES)) + b"\n")
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            path.unlink()
        raise
    os.close(fd)
    return True


def load_key(path: Path) -> SecretBox:
    """The key in `path`; KeyFileError when it is missing, open to others, or malformed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise KeyFileError(missing_key_message(path)) from None
    except OSError as exc:
        raise KeyFileError(f"the encryption key {path} cannot be read ({exc.strerror})") \
            from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise KeyFileError(f"the encryption key {path} is not a regular file")
        if mode & 0o077:
            raise KeyFileError(f"the encryption key {path} is readable by others (mode "
                               f"{stat.S_IMODE(mode):04o}): chmod 600 it")
        raw = os.read(fd, 4096)
    finally:
        os.close(fd)
    try:
        key = base64.b64decode(raw.strip(), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise KeyFileError(f"the encryption key {path} is not {KEY_BYTES} bytes of base64 "
                           "(as `pandastack setup` writes it)")
    return SecretBox(key)


class SecretBox:
    """Seals and opens short secrets with one key; `key_id` names the key (a hash of it, never
    the key), so a value sealed by another key is told apart from an altered one."""

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"a key is {KEY_BYTES} bytes")
        self._aead = AESGCM(key)
        self.key_id = hashlib.sha256(b"pandastack-key-id\0" + key).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"SecretBox(key_id={self.key_id!r})"

    def seal(self, plaintext: str, context: str) -> str:
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, plaintext.encode(), context.encode())
        return SEALED_PREFIX + base64.b64encode(nonce + sealed).decode()

    def open(self, sealed: str, context: str) -> str:
        if not sealed.startswith(SEALED_PREFIX):
            raise UnsealError("not a sealed value of this version")
        try:
            raw = base64.b64decode(sealed[len(SEALED_PREFIX):], validate=True)
            return self._aead.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:],
                                      context.encode()).decode()
        except (InvalidTag, binascii.Error, ValueError):
            raise UnsealError("the value does not open with this key") from None
