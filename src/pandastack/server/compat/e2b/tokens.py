"""The tokens E2B's SDKs carry to a sandbox: `envdAccessToken` (`X-Access-Token`, on every
daemon call) and `trafficAccessToken` (`E2B-Traffic-Access-Token`, on the code interpreter's
and other ports' calls). Both are HMAC-SHA256 of the sandbox id under a server key kept in the
database (so every API server on it derives the same), each with its own label: nothing to
store per sandbox, and a token opens exactly one sandbox, whose row then names the team."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import weakref

from pandastack.server.store import Store

SECRET_NAME = "e2b_token_key"
ENVD = b"e2b-envd-access:"
TRAFFIC = b"e2b-traffic-access:"


class SandboxTokens:
    def __init__(self, key: bytes) -> None:
        self._key = key

    @classmethod
    def for_store(cls, store: Store) -> SandboxTokens:
        return cls(store.server_secret(SECRET_NAME, lambda: secrets.token_hex(32)).encode())

    def _derive(self, label: bytes, sandbox_id: str) -> str:
        return hmac.new(self._key, label + sandbox_id.encode(), hashlib.sha256).hexdigest()

    def envd_access(self, sandbox_id: str) -> str:
        return self._derive(ENVD, sandbox_id)

    def traffic_access(self, sandbox_id: str) -> str:
        return self._derive(TRAFFIC, sandbox_id)

    def opens_envd(self, sandbox_id: str, token: str) -> bool:
        return hmac.compare_digest(self.envd_access(sandbox_id).encode(),
                                   token.encode("utf-8", "replace"))

    def opens_traffic(self, sandbox_id: str, token: str) -> bool:
        """The traffic token, or the access token (which opens everything of its sandbox)."""
        given = token.encode("utf-8", "replace")
        return (hmac.compare_digest(self.traffic_access(sandbox_id).encode(), given)
                or hmac.compare_digest(self.envd_access(sandbox_id).encode(), given))


_BY_STORE: weakref.WeakKeyDictionary[Store, SandboxTokens] = weakref.WeakKeyDictionary()


def tokens_for(store: Store) -> SandboxTokens:
    """The tokens of the server key in `store`'s database, read once per store (and gone
    with it)."""
    found = _BY_STORE.get(store)
    if found is None:
        found = _BY_STORE[store] = SandboxTokens.for_store(store)
    return found
