"""The certificate options `serve` and `agent` share (cli/tls.add_cert_options): each pair
is read back as the Settings fields of its name, and only the files that were given."""

from __future__ import annotations

import argparse
from pathlib import Path

from pandastack.cli import agent, serve
from pandastack.cli.tls import cert_options


def _parse(command: str, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    {"serve": serve, "agent": agent}[command].add_parser(sub)
    return parser.parse_args([command, *argv])


def test_serve_reads_each_pair_under_its_settings_names() -> None:
    args = _parse("serve", ["--tls-cert", "api.pem", "--tls-key", "api.key",
                            "--agent-client-cert", "client.pem"])
    assert cert_options(args, "tls") == {"tls_cert": Path("api.pem"),
                                         "tls_key": Path("api.key")}
    assert cert_options(args, "agent-client") == {"agent_client_cert": Path("client.pem")}
    assert cert_options(args, "sandbox-tls") == {}


def test_agent_reads_its_pair_and_none_without_arguments() -> None:
    args = _parse("agent", ["--tls-key", "agent.key"])
    assert cert_options(args, "tls") == {"tls_key": Path("agent.key")}
    assert cert_options(None, "tls") == {}
