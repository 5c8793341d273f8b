"""Signed port URLs: `?ps_expires=<unix>&ps_sig=<hex>`, where the signature is
HMAC-SHA256(server key, "sandbox_id:port:expires"). The key is the `url_signing_secret`
setting, or one generated once and kept in the database (so every server on that database
accepts the URLs of the others)."""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import re
import secrets
import time
from urllib.parse import unquote_plus

from ..settings import Settings
from ..store import Store

EXPIRES_PARAM = "ps_expires"
SIGNATURE_PARAM = "ps_sig"
SIGNED_PARAMS = (EXPIRES_PARAM, SIGNATURE_PARAM)
SECRET_NAME = "url_signing_key"
REDACTED = "REDACTED"
# The loggers that write request URLs: uvicorn's access log, its WebSocket handshakes, and
# httpx's requests (the port proxy's, upstream; it drops ps_* parameters, but only by their
# exact name).
URL_LOGGERS = ("uvicorn.access", "uvicorn.error", "httpx")
# One `name=value` item of a query string, as it stands in a logged URL.
_QUERY_ITEM = re.compile(r"(?<=[?&])([^=&\s\"?#]*)=([^&\s\"#]*)")


class UrlSigner:
    def __init__(self, key: bytes) -> None:
        self._key = key

    @classmethod
    def for_server(cls, store: Store, settings: Settings) -> UrlSigner:
        secret = settings.url_signing_secret or store.server_secret(
            SECRET_NAME, lambda: secrets.token_hex(32))
        return cls(secret.encode())

    def signature(self, sandbox_id: str, port: int, expires: int) -> str:
        message = f"{sandbox_id}:{port}:{expires}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def sign(self, sandbox_id: str, port: int, ttl_seconds: int,
             now: float | None = None) -> tuple[int, str]:
        """(expires, signature) of a URL valid for `ttl_seconds` from now (rounded up)."""
        expires = math.ceil((time.time() if now is None else now) + ttl_seconds)
        return expires, self.signature(sandbox_id, port, expires)

    def check(self, sandbox_id: str, port: int, expires: str, signature: str,
              now: float | None = None) -> str | None:
        """None if the signature is this server's and has not expired; else why not."""
        if not (expires.isascii() and expires.isdigit() and len(expires) <= 12):
            return "malformed ps_expires"
        expected = self.signature(sandbox_id, port, int(expires))
        if not hmac.compare_digest(expected.encode(), signature.encode("utf-8", "replace")):
            return "invalid signature"
        if (time.time() if now is None else now) > int(expires):
            return "signed URL expired"
        return None


def redact_signatures(text: str) -> str:
    """`text` with the value of every signature parameter of a URL in it replaced by
    REDACTED. Names are compared decoded (`ps%5Fsig` is `ps_sig` to the server too)."""
    if "=" not in text:
        return text

    def item(match: re.Match[str]) -> str:
        if unquote_plus(match.group(1)) != SIGNATURE_PARAM:
            return match.group(0)
        return f"{match.group(1)}={REDACTED}"

    return _QUERY_ITEM.sub(item, text)


class SignatureRedactor(logging.Filter):
    """Rewrites a record's message and arguments so that no signature of a signed URL reaches
    a log: whoever reads the log could use the URL until it expires."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact_signatures(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_redacted_arg(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: _redacted_arg(v) for k, v in record.args.items()}
        return True


def _redacted_arg(arg: object) -> object:
    """`arg`, or its text redacted if that holds a signature (httpx logs URL objects)."""
    if isinstance(arg, int | float | bytes) or arg is None:
        return arg
    text = arg if isinstance(arg, str) else str(arg)
    redacted = redact_signatures(text)
    return arg if redacted == text else redacted


def redact_signatures_in_logs() -> None:
    """Put a SignatureRedactor on every logger that writes request URLs (once)."""
    for name in URL_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, SignatureRedactor) for f in logger.filters):
            logger.addFilter(SignatureRedactor())
