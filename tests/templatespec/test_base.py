"""Which FROM names are ours and which are images (issue 37 item 1)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pandastack.host.images.oci.reference import parse_reference
from pandastack.templatespec import TemplateSpec, from_dockerfile
from pandastack.templatespec.base import base_kind, names_an_image

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(("name", "kind"), [
    ("base", "template"), ("node", "template"), ("my-template", "template"),
    # a bare name is ours even where Docker Hub has an image of it (unknown: a 404)
    ("python", "template"), ("alpine", "template"),
    ("snapshot:abc123", "snapshot"), ("snapshot:my.snap-1", "snapshot"),
    # a tag, digest, path or registry host: an image even where we have that bare name
    ("python:3.12-slim", "image"), ("base:latest", "image"), (f"node@{DIGEST}", "image"),
    ("library/base", "image"), ("acme/tool", "image"), ("ghcr.io/acme/agent-env:4", "image"),
    ("localhost:5000/x", "image"), ("127.0.0.1:5000/tests/busybox:v1", "image"),
    ("library/snapshot:v1", "image"), ("library/alpine", "image"), ("alpine:latest", "image"),
])
def test_ours_or_an_image(name: str, kind: str) -> None:
    assert base_kind(name) == kind
    assert names_an_image(name) is (kind == "image")


def test_every_image_name_parses_as_a_reference() -> None:
    assert str(parse_reference("library/alpine")) == "docker.io/library/alpine"
    assert parse_reference("library/alpine").reference == "latest"
    assert str(parse_reference("base:latest")) == "docker.io/library/base:latest"



@pytest.mark.parametrize("name", [
    "python:3.12-slim", "ghcr.io/acme/agent-env:4", f"alpine@{DIGEST}",
    "127.0.0.1:5000/tests/busybox:v1", "[::1]:5000/x:y", "library/alpine"])
def test_a_spec_and_a_dockerfile_may_start_from_an_image(name: str) -> None:
    assert TemplateSpec(from_template=name).from_template == name
    assert from_dockerfile(f"FROM {name}\nRUN true\n").from_template == name


@pytest.mark.parametrize("name", ["no spaces", "a b:c", "x;y", "-x", "a" * 129, "a\nb"])
def test_other_bases_are_refused(name: str) -> None:
    with pytest.raises(ValidationError, match=r"invalid base template|at most 128"):
        TemplateSpec(from_template=name)
