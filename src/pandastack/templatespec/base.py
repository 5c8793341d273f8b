"""What a template is built FROM: one of ours (a built-in such as `base`, the team's own
template, or `snapshot:<id>`) or an OCI image (issue 37, ADR 0046).

A bare name (no tag, digest, registry host or path) is a template: a built-in or one of the
team's (an unknown one is a 404 naming it, as before images: a name another team uses must
not start a pull instead); anything with a `:`, `@` or `/` is an image (`python:3.12-slim`,
`acme/tool`, `ghcr.io/acme/env@sha256:...`). So Docker Hub's `alpine` is written
`alpine:latest` or `library/alpine`. `snapshot:<id>` is ours, never the Docker Hub image
`snapshot`; that one is written with its path (`library/snapshot:<tag>`)."""

from __future__ import annotations

from typing import Literal

SNAPSHOT_PREFIX = "snapshot:"
BaseKind = Literal["template", "snapshot", "image"]
_IMAGE_MARKS = (":", "@", "/")


def base_kind(name: str) -> BaseKind:
    """Which kind of base `name` is (whether a template of that name exists is the caller's
    question)."""
    if name.startswith(SNAPSHOT_PREFIX):
        return "snapshot"
    return "image" if any(mark in name for mark in _IMAGE_MARKS) else "template"


def names_an_image(name: str) -> bool:
    return base_kind(name) == "image"
