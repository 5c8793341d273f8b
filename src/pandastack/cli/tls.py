"""The server side of TLS for `serve` and `agent` (ADR 0048): SSL contexts from the operator's
certificate files, checked before anything starts so a wrong path or a key that does not match
is one line of error, not a traceback from inside uvicorn."""

from __future__ import annotations

import argparse
import ssl
from collections.abc import Callable
from pathlib import Path


def add_cert_options(p: argparse.ArgumentParser, name: str, *, cert_help: str,
                     key_help: str) -> None:
    """`--NAME-cert PEM` and `--NAME-key PEM`, read back by `cert_options`."""
    p.add_argument(f"--{name}-cert", type=Path, default=None, metavar="PEM", help=cert_help)
    p.add_argument(f"--{name}-key", type=Path, default=None, metavar="PEM", help=key_help)


def cert_options(args: argparse.Namespace | None, name: str) -> dict[str, Path]:
    """The files of `add_cert_options(p, name)` that were given, by their destinations
    (`tls_cert`, `sandbox_tls_key`, ...: the Settings fields of the same names)."""
    dest = name.replace("-", "_")
    given = {part: getattr(args, part, None) for part in (f"{dest}_cert", f"{dest}_key")}
    return {part: path for part, path in given.items() if path is not None}


class TLSFilesError(ValueError):
    """A certificate, key or CA file that cannot be used; the message names it."""


def server_context(cert: Path, key: Path, *, client_ca: Path | None = None,
                   what: str = "--tls-cert/--tls-key") -> ssl.SSLContext:
    """A server context presenting `cert` (with its chain) under `key`; with `client_ca`,
    clients must present a certificate that CA issued (mutual TLS)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    # uvicorn speaks HTTP/1.1 only; saying so stops a client from offering h2 and failing.
    ctx.set_alpn_protocols(["http/1.1"])
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise TLSFilesError(f"{what} {cert} / {key}: {exc}") from None
    if client_ca is not None:
        try:
            ctx.load_verify_locations(cafile=client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise TLSFilesError(f"--tls-client-ca {client_ca}: {exc}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def by_server_name(default: ssl.SSLContext, domain: str,
                   wildcard: ssl.SSLContext) -> ssl.SSLContext:
    """`default`, switching to `wildcard` for a client whose SNI names a host under `domain`
    (`{port}-{id}.{domain}`): the API and the sandbox listener are one uvicorn server, one
    context, so the sandbox listener's own certificate is chosen by name, not by port."""
    suffix = "." + domain.lower().rstrip(".")

    def pick(conn: ssl.SSLObject | ssl.SSLSocket, server_name: str | None,
             _ctx: ssl.SSLContext) -> None:
        if server_name and server_name.lower().rstrip(".").endswith(suffix):
            conn.context = wildcard

    default.sni_callback = pick
    return default


def fixed(ctx: ssl.SSLContext) -> Callable[..., ssl.SSLContext]:
    """uvicorn's `ssl_context_factory` handing it a context made here."""
    return lambda *_: ctx
