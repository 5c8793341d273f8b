"""Dashboard sessions (docs/adr/0034-dashboard.md): stateless, HMAC-signed cookies that name an
API key by its id and carry an expiry, never the key itself, and the CSRF token bound to each.

A cookie is `<key id>.<expires>.<nonce>.<signature>`. The signature proves this server (or one
sharing its database) made it; the key row is read again on every request, so revoking the key
ends all its sessions at once, and the store keeps no session rows (no migration)."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass

from ..store import Store

COOKIE = "ps_dashboard"
# Its name over https: a browser takes a `__Host-` cookie only from this very host, with
# Secure, Path=/ and no Domain, so a sandbox's page on a sibling host of the same parent
# domain cannot plant its own session in a visitor's browser (fixation). Plain http has no
# such name (browsers refuse Secure cookies there), so `COOKIE` stays for it.
SECURE_COOKIE = "__Host-" + COOKIE
CSRF_HEADER = "x-csrf-token"
SESSION_SECONDS = 12 * 3600
SECRET_NAME = "dashboard_session_key"
# Key ids are `key_` + 16 hex digits (server.auth); the rest is ours. Anything else in the
# cookie is refused before the HMAC is computed.
_COOKIE_RE = re.compile(r"^(key_[0-9a-f]{1,64})\.([0-9]{1,12})\.([0-9a-f]{16})\.([0-9a-f]{64})$")


@dataclass(frozen=True)
class Session:
    key_id: str
    expires: int
    cookie: str


class SessionSigner:
    """Signs and checks session cookies and their CSRF tokens with one server secret, kept in
    the database beside the URL-signing key (but not the same one: a signature of one kind
    must never pass for the other)."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    @classmethod
    def for_store(cls, store: Store) -> SessionSigner:
        return cls(store.server_secret(SECRET_NAME, lambda: secrets.token_hex(32)).encode())

    def _mac(self, purpose: str, message: str) -> str:
        return hmac.new(self._secret, f"{purpose}:{message}".encode(), hashlib.sha256).hexdigest()

    def issue(self, key_id: str, now: float | None = None) -> Session:
        expires = int((time.time() if now is None else now) + SESSION_SECONDS)
        body = f"{key_id}.{expires}.{secrets.token_hex(8)}"
        cookie = f"{body}.{self._mac('dashboard-session', body)}"
        return Session(key_id, expires, cookie)

    def check(self, cookie: str | None, now: float | None = None) -> Session | None:
        """The session of a well-formed, authentic, unexpired cookie, else None."""
        match = _COOKIE_RE.match(cookie or "")
        if match is None or cookie is None:
            return None
        body, signature = cookie.rsplit(".", 1)
        if not hmac.compare_digest(self._mac("dashboard-session", body), signature):
            return None
        expires = int(match.group(2))
        if (time.time() if now is None else now) >= expires:
            return None
        return Session(match.group(1), expires, cookie)

    def csrf_token(self, session: Session) -> str:
        # Bound to the cookie: a token read from another session (or an old one) is useless.
        return self._mac("dashboard-csrf", session.cookie)

    def csrf_ok(self, session: Session, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(
            self.csrf_token(session).encode(), token.encode("utf-8", "replace"))
