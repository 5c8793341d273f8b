"""Reading the fields of a Connect request's JSON as protobuf's JSON mapping gives them
(numbers as numbers or decimal strings, bytes as standard or URL-safe base64): each reader
answers `invalid_argument` naming the field, never a 500."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from .connect import ConnectError, Message


def invalid(message: str) -> ConnectError:
    return ConnectError("invalid_argument", message)


def as_object(value: Any, what: str) -> Message:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid(f"{what} must be an object")
    return value


def as_string(value: Any, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid(f"{what} must be a string")
    return value


def as_uint(value: Any, what: str) -> int:
    # protobuf's JSON takes numbers as numbers or as decimal strings
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**32:
        raise invalid(f"{what} must be an unsigned 32-bit integer")
    return value


def as_bytes(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise invalid(f"{what} must be base64 bytes")
    try:
        # protobuf's JSON parsers take standard or URL-safe base64, padded or not
        text = value.replace("-", "+").replace("_", "/")
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise invalid(f"{what} is not base64") from None
