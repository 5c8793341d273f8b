"""Which FROM names are ours and which are images (issue 37 item 1)."""

from __future__ import annotations

import pytest

from pandastack.host.images.oci.reference import parse_reference
from pandastack.templatespec.base import base_kind, names_an_image

DIGEST = "sha256:" + "ab" * 32
OURS = frozenset({"base", "node", "code-interpreter", "my-template", "python"})


@pytest.mark.parametrize(("name", "kind"), [
    ("base", "template"), ("node", "template"), ("my-template", "template"),
    # a team's template shadows the Docker Hub image of the same bare name
    ("python", "template"),
    ("snapshot:abc123", "snapshot"), ("snapshot:my.snap-1", "snapshot"),
    # a tag, digest, path or registry host: an image even where we have that bare name
    ("python:3.12-slim", "image"), ("base:latest", "image"), (f"node@{DIGEST}", "image"),
    ("library/base", "image"), ("acme/tool", "image"), ("ghcr.io/acme/agent-env:4", "image"),
    ("localhost:5000/x", "image"), ("127.0.0.1:5000/tests/busybox:v1", "image"),
    ("library/snapshot:v1", "image"),
    # a bare name we have no template of is Docker Hub's
    ("alpine", "image"), ("bsae", "image"),
])
def test_ours_or_an_image(name: str, kind: str) -> None:
    assert base_kind(name, OURS) == kind
    assert names_an_image(name, OURS) is (kind == "image")


def test_every_image_name_parses_as_a_reference() -> None:
    assert str(parse_reference("alpine")) == "docker.io/library/alpine"
    assert parse_reference("alpine").reference == "latest"
    assert str(parse_reference("base:latest")) == "docker.io/library/base:latest"


def test_without_templates_every_bare_name_is_an_image() -> None:
    assert base_kind("base", ()) == "image"
    assert base_kind("snapshot:x", ()) == "snapshot"
