"""The registry an image reference is pulled from, as the control plane reads it to pick a
team's credentials, is the host parser's (host/images/oci/reference.py) for every form of
reference; registry names as teams write them are normalised the same way."""

from __future__ import annotations

import pytest

from pandastack.host.images.oci.reference import parse_reference
from pandastack.templatespec.registry_host import image_registry, normal_registry

REFERENCES = [
    "python:3.12-slim", "library/python", "acme/tool:1", "docker.io/acme/tool:1",
    "index.docker.io/library/alpine:3", "registry-1.docker.io/x/y@sha256:" + "a" * 64,
    "ghcr.io/acme/agent-env:4", "GHCR.IO/acme/env:1", "localhost/x:1", "localhost:5000/x/y:2",
    "127.0.0.1:5000/tests/busybox:v1", "registry.example.com:8443/a/b/c:tag",
    "[::1]:5000/x:1", "example.com/x@sha256:" + "b" * 64,
]


@pytest.mark.parametrize("reference", REFERENCES)
def test_the_registry_is_the_host_parsers(reference: str) -> None:
    assert image_registry(reference) == parse_reference(reference).registry


@pytest.mark.parametrize(("written", "normal"), [
    ("ghcr.io", "ghcr.io"), ("GHCR.io ", "ghcr.io"), ("docker.io", "docker.io"),
    ("index.docker.io", "docker.io"), ("registry-1.docker.io", "docker.io"),
    ("localhost:5000", "localhost:5000"), ("127.0.0.1:5000", "127.0.0.1:5000"),
    ("[::1]:5000", "[::1]:5000"), ("registry.example.com:443", "registry.example.com:443"),
])
def test_registry_names_are_normalised(written: str, normal: str) -> None:
    assert normal_registry(written) == normal


@pytest.mark.parametrize("bad", [
    "", "https://ghcr.io", "ghcr.io/acme", "ghcr.io:0", "ghcr.io:70000", "-bad.io",
    "user@ghcr.io", "a" * 300, "ghcr.io:port", "bad_host.io",
])
def test_what_is_not_a_registry(bad: str) -> None:
    with pytest.raises(ValueError, match=r"host\[:port\]"):
        normal_registry(bad)
