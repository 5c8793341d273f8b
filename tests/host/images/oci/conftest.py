"""Real registries on loopback for the OCI tests (Debian's docker-registry), the images they
hold made by the tests and pushed with skopeo."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.host.images.oci.registry import Registry, htpasswd_auth, run_registry
from tests.host.images.oci.tokens import TokenService, run_token_service

USER, PASSWORD = "alice", "correct horse"

needs_registry = pytest.mark.skipif(
    not (shutil.which("docker-registry") and shutil.which("skopeo") and shutil.which("htpasswd")),
    reason="needs docker-registry, skopeo and htpasswd (make deps)")


@pytest.fixture(scope="session")
def skopeo_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("skopeo") / "policy.json"
    path.write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
    return path


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with run_registry(tmp_path_factory.mktemp("registry")) as running:
        yield running


@pytest.fixture(scope="session")
def basic_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    tmp = tmp_path_factory.mktemp("basic-registry")
    with run_registry(tmp, htpasswd_auth(tmp, USER, PASSWORD)) as running:
        yield running


@dataclass(frozen=True)
class TokenRegistry:
    registry: Registry
    tokens: TokenService
    realm_host: str


@pytest.fixture(scope="session")
def token_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TokenRegistry]:
    tmp = tmp_path_factory.mktemp("token-registry")
    with run_token_service({USER: PASSWORD}) as (tokens, realm), \
            run_registry(tmp, tokens.registry_auth(tmp, realm)) as running:
        yield TokenRegistry(running, tokens, realm.split("/")[2])
