"""What a template is built FROM: one of ours (a built-in such as `base`, the team's own
template, or `snapshot:<id>`) or an OCI image (issue 37, ADR 0046).

Docker's rule read with ours first: a bare name (no tag, digest, registry host or path) that
is a built-in or one of the team's templates is that template; anything with a `:`, `@` or
`/` is an image (`python:3.12-slim`, `acme/tool`, `ghcr.io/acme/env@sha256:...`), and so is a
bare name we have no template of (`FROM alpine` is Docker Hub's `library/alpine:latest`).
`snapshot:<id>` is ours, never the Docker Hub image `snapshot`; that one is written with its
path (`library/snapshot:<tag>`)."""

from __future__ import annotations

from collections.abc import Container
from typing import Literal

SNAPSHOT_PREFIX = "snapshot:"
BaseKind = Literal["template", "snapshot", "image"]
_IMAGE_MARKS = (":", "@", "/")


def base_kind(name: str, templates: Container[str]) -> BaseKind:
    """Which kind of base `name` is, `templates` being the built-ins' and the team's
    template names."""
    if name.startswith(SNAPSHOT_PREFIX):
        return "snapshot"
    if any(mark in name for mark in _IMAGE_MARKS):
        return "image"
    return "template" if name in templates else "image"


def names_an_image(name: str, templates: Container[str] = ()) -> bool:
    return base_kind(name, templates) == "image"
