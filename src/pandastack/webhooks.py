"""Checking that a webhook request came from your pandastack server (stdlib only):

    from pandastack.webhooks import verify_signature

    event = verify_signature(secret, request.headers, raw_body)  # raises if it is not

The server signs `timestamp + "." + body` with HMAC-SHA256 under the webhook's secret and
sends `X-Pandastack-Signature: t=<unix seconds>,v1=<hex>`. A request older (or newer) than
`tolerance_seconds` is refused, so a captured request cannot be replayed later.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any

__all__ = ["SIGNATURE_HEADER", "InvalidSignature", "sign", "verify_signature"]

SIGNATURE_HEADER = "X-Pandastack-Signature"


class InvalidSignature(ValueError):
    """The request is not one the server signed with this secret (or it is too old)."""


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The `v1` signature of `body` sent at `timestamp` (hex)."""
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body,
                    hashlib.sha256).hexdigest()


def _header(headers: Mapping[str, str] | str) -> str:
    if isinstance(headers, str):
        return headers
    for name, value in headers.items():
        if name.lower() == SIGNATURE_HEADER.lower():
            return value
    raise InvalidSignature(f"no {SIGNATURE_HEADER} header")


def verify_signature(secret: str, headers: Mapping[str, str] | str, body: bytes | str,
                     tolerance_seconds: float = 300, *,
                     now: float | None = None) -> dict[str, Any]:
    """The event the request carries, if `headers` (or the signature header's value) sign
    `body` (the raw request body, as received) under `secret` within `tolerance_seconds` of
    `now`; InvalidSignature otherwise. Any `v1` value may match (a rotated secret's)."""
    raw = body.encode() if isinstance(body, str) else bytes(body)
    timestamp: int | None = None
    given: list[str] = []
    for part in _header(headers).split(","):
        key, _, value = part.strip().partition("=")
        if key == "t" and value.isdigit():
            timestamp = int(value)
        elif key == "v1" and value:
            given.append(value.strip())
    if timestamp is None or not given:
        raise InvalidSignature(f"malformed {SIGNATURE_HEADER} (want t=<unix>,v1=<hex>)")
    now = time.time() if now is None else now
    if abs(now - timestamp) > tolerance_seconds:
        raise InvalidSignature(f"the signature's time is {now - timestamp:.0f} s off "
                               f"(tolerance {tolerance_seconds:g} s)")
    expected = sign(secret, timestamp, raw)
    if not any(hmac.compare_digest(expected, v) for v in given):
        raise InvalidSignature("the signature does not match")
    try:
        event: dict[str, Any] = json.loads(raw)
    except ValueError:
        raise InvalidSignature("the body is not JSON") from None
    return event
