"""Certificates made by the test with `openssl`, as an operator would issue them: a CA, the
API's and agents' server certificate (127.0.0.1, localhost; an agent shows it to other
agents as a client too, so it is for both), a wildcard certificate of the sandbox listener
(*.sandbox.test) and a client certificate for mutual TLS. A second, unrelated CA is there to
issue what a trusted CA did not; `serving_only` is a server certificate that is not for
clients (an agent's from before its streams to other agents had TLS)."""

from __future__ import annotations

import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

SANDBOX_DOMAIN = "sandbox.test"


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class IssuedCerts:
    ca: Path
    server: Pair
    wildcard: Pair
    client: Pair
    other_ca: Path
    stranger: Pair  # a client certificate the other CA issued
    serving_only: Pair


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(root: Path, name: str) -> tuple[Path, Path]:
    cert, key = root / f"{name}.pem", root / f"{name}.key"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-days", "2", "-subj", f"/CN=pandastack test {name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             "-keyout", str(key), "-out", str(cert), cwd=root)
    return cert, key


def _issue(root: Path, name: str, ca: tuple[Path, Path], subject: str,
           extensions: str) -> Pair:
    key, csr, cert = root / f"{name}.key", root / f"{name}.csr", root / f"{name}.pem"
    ext = root / f"{name}.ext"
    ext.write_text(extensions)
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-subj", subject, "-keyout", str(key), "-out", str(csr), cwd=root)
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
             "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(cert), cwd=root)
    return Pair(cert, key)


def make_test_certs(root: Path) -> IssuedCerts:
    root.mkdir(parents=True, exist_ok=True)
    ca = _ca(root, "ca")
    other = _ca(root, "other-ca")
    server_ext = "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
    client_ext = "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n"
    names = "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
    return IssuedCerts(
        ca=ca[0],
        server=_issue(root, "server", ca, "/CN=localhost",
                      "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n"
                      + names),
        wildcard=_issue(root, "wildcard", ca, f"/CN=*.{SANDBOX_DOMAIN}",
                        server_ext + f"subjectAltName=DNS:*.{SANDBOX_DOMAIN}\n"),
        client=_issue(root, "client", ca, "/CN=control-plane", client_ext),
        other_ca=other[0],
        stranger=_issue(root, "stranger", other, "/CN=stranger", client_ext),
        serving_only=_issue(root, "serving-only", ca, "/CN=localhost", server_ext + names),
    )


def peer_names(tls: ssl.SSLSocket) -> list[str]:
    """The subjectAltName values of the certificate `tls`'s peer showed."""
    cert = tls.getpeercert()
    assert cert is not None, "the peer showed no certificate"
    return [str(entry[1]) for entry in cert.get("subjectAltName", ())]
