"""A bearer-token service as Docker Hub and ghcr run one: the registry (auth: token) sends
clients here with a WWW-Authenticate challenge; we check their basic credentials and sign a
JWT (RS256, the certificate in its x5c header, trusted by the registry's rootcertbundle)
granting the scope they asked for. Anonymous clients may pull `public/*` only."""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from tests.threaded_server import serving

SERVICE = "pandastack-test-registry"
ISSUER = "pandastack-test-tokens"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenService:
    def __init__(self, users: dict[str, str]) -> None:
        self.users = users
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ISSUER)])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(days=1))
                     .not_valid_after(now + datetime.timedelta(days=1))
                     .sign(self.key, hashes.SHA256()))
        self.issued = 0

    def grant(self, user: str | None, scope: str) -> list[dict[str, object]]:
        kind, _, rest = scope.partition(":")
        name, _, actions = rest.rpartition(":")
        if kind != "repository" or not name:
            return []
        wanted = [a for a in actions.split(",") if a]
        allowed = wanted if user else [a for a in wanted if a == "pull"
                                       and name.startswith("public/")]
        return [{"type": "repository", "name": name, "actions": allowed}]

    def token(self, user: str | None, scopes: list[str]) -> str:
        now = int(time.time())
        header = {"alg": "RS256", "typ": "JWT",
                  "x5c": [base64.b64encode(self.cert.public_bytes(
                      serialization.Encoding.DER)).decode()]}
        claims = {"iss": ISSUER, "sub": user or "", "aud": SERVICE, "exp": now + 300,
                  "nbf": now - 10, "iat": now, "jti": uuid.uuid4().hex,
                  "access": [grant for scope in scopes for grant in self.grant(user, scope)]}
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        signature = self.key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        self.issued += 1
        return f"{signing_input}.{_b64(signature)}"

    def registry_auth(self, tmp: Path, realm: str) -> str:
        bundle = tmp / "token-ca.pem"
        bundle.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        return f"""auth:
  token:
    realm: {realm}
    service: {SERVICE}
    issuer: {ISSUER}
    rootcertbundle: {bundle}
"""


@contextlib.contextmanager
def run_token_service(users: dict[str, str]) -> Iterator[tuple[TokenService, str]]:
    """Yield the service and its realm URL (http://127.0.0.1:port/token)."""
    service = TokenService(users)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            user: str | None = None
            header = self.headers.get("Authorization", "")
            if header.startswith("Basic "):
                name, _, password = base64.b64decode(header[6:]).decode().partition(":")
                if service.users.get(name) != password:
                    self.send_response(401)
                    self.end_headers()
                    return
                user = name
            if url.path != "/token" or query.get("service") != [SERVICE]:
                self.send_response(400)
                self.end_headers()
                return
            body = json.dumps({"token": service.token(user, query.get("scope", []))}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with serving(server):
        yield service, f"http://127.0.0.1:{server.server_address[1]}/token"
