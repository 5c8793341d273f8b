"""Image references as Docker writes them, and which FROM names are ours."""

from __future__ import annotations

import pytest

from pandastack.host.images.oci.errors import InvalidImageReference
from pandastack.host.images.oci.reference import ImageReference, parse_reference

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(("text", "expected"), [
    ("python:3.12-slim", ImageReference("docker.io", "library/python", "3.12-slim")),
    ("ubuntu", ImageReference("docker.io", "library/ubuntu")),
    ("bitnami/redis:7", ImageReference("docker.io", "bitnami/redis", "7")),
    ("index.docker.io/library/node:22", ImageReference("docker.io", "library/node", "22")),
    ("ghcr.io/acme/agent-env:4", ImageReference("ghcr.io", "acme/agent-env", "4")),
    ("127.0.0.1:5000/a/b/c", ImageReference("127.0.0.1:5000", "a/b/c")),
    ("localhost/tool", ImageReference("localhost", "tool")),
    ("[::1]:5000/x:y", ImageReference("[::1]:5000", "x", "y")),
    (f"alpine@{DIGEST}", ImageReference("docker.io", "library/alpine", None, DIGEST)),
    (f"reg.example:443/a:1@{DIGEST}", ImageReference("reg.example:443", "a", "1", DIGEST)),
    ("my_org/a__b-c.d:v1.0_rc-1", ImageReference("docker.io", "my_org/a__b-c.d", "v1.0_rc-1")),
])
def test_references_parse_as_docker_reads_them(text: str, expected: ImageReference) -> None:
    assert parse_reference(text) == expected


def test_what_is_asked_for_and_where() -> None:
    hub = parse_reference("python")
    assert (hub.reference, hub.api_host, str(hub)) == (
        "latest", "registry-1.docker.io", "docker.io/library/python")
    pinned = parse_reference(f"ghcr.io/a/b:4@{DIGEST}")
    assert pinned.reference == DIGEST  # the digest wins over the tag
    assert pinned.api_host == "ghcr.io"


@pytest.mark.parametrize("text", [
    "", "Python", "a/../b", "x:y:z", "host:99999/a", "host:0/a", "a@sha256:12",
    f"a@md5:{'a' * 32}", ":tag", "a:", "a:-tag", "a//b", "/a", "a/", "a:" + "t" * 129,
    "x" * 600, "bad_host!:5000/a", "a b",
])
def test_bad_references_are_refused_naming_them(text: str) -> None:
    with pytest.raises(InvalidImageReference, match=r"^image "):
        parse_reference(text)

