"""Credentials against real registries on loopback: basic auth (htpasswd) and the bearer-token
flow (a token service of the tests', the registry checking its signed tokens)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pandastack.host.images.oci.auth import Credentials, parse_challenge
from pandastack.host.images.oci.errors import RegistryAuthError
from tests.host.images.oci.conftest import PASSWORD, USER, TokenRegistry, needs_registry
from tests.host.images.oci.helpers import pull, push_image, settings
from tests.host.images.oci.layers import file, gzipped
from tests.host.images.oci.registry import Registry

RIGHT = Credentials(USER, PASSWORD)
WRONG = Credentials(USER, "wrong horse")


@needs_registry
def test_basic_auth_pulls_with_the_right_password_only(
        basic_registry: Registry, tmp_path: Path, skopeo_policy: Path) -> None:
    push_image(basic_registry, tmp_path, skopeo_policy, "team/private",
               [gzipped([file("secret", "s3cret")])], creds=f"{USER}:{PASSWORD}")
    image = f"{basic_registry.host}/team/private:v1"
    conf = settings(basic_registry.host)
    _, root = pull(image, tmp_path, conf, credentials=RIGHT)
    assert (root / "secret").read_text() == "s3cret"
    with pytest.raises(RegistryAuthError, match=rf"{image}: the registry refused user 'alice'"):
        pull(image, tmp_path, conf, credentials=WRONG)
    with pytest.raises(RegistryAuthError, match=rf"{image}: the registry needs credentials"):
        pull(image, tmp_path, conf)


@needs_registry
def test_bearer_tokens_anonymous_for_public_and_credentials_for_private(
        token_registry: TokenRegistry, tmp_path: Path, skopeo_policy: Path) -> None:
    registry = token_registry.registry
    creds = f"{USER}:{PASSWORD}"
    push_image(registry, tmp_path, skopeo_policy, "public/tool",
               [gzipped([file("tool", "public")])], creds=creds)
    push_image(registry, tmp_path, skopeo_policy, "team/agent",
               [gzipped([file("agent", "private")])], creds=creds)
    conf = settings(registry.host, token_registry.realm_host)
    issued = token_registry.tokens.issued
    _, root = pull(f"{registry.host}/public/tool:v1", tmp_path, conf)
    assert (root / "tool").read_text() == "public"
    assert token_registry.tokens.issued == issued + 1  # one token served the whole pull
    _, root = pull(f"{registry.host}/team/agent:v1", tmp_path, conf, credentials=RIGHT)
    assert (root / "agent").read_text() == "private"
    image = f"{registry.host}/team/agent:v1"
    with pytest.raises(RegistryAuthError, match=rf"{image}: the token service refused user"):
        pull(image, tmp_path, conf, credentials=WRONG)
    with pytest.raises(RegistryAuthError, match=rf"{image}: the registry refused anonymous"):
        pull(image, tmp_path, conf)


@needs_registry
def test_credentials_go_to_a_token_realm_only_over_https_or_an_insecure_registry(
        token_registry: TokenRegistry, tmp_path: Path) -> None:
    registry = token_registry.registry
    issued = token_registry.tokens.issued
    with pytest.raises(RegistryAuthError, match="is not an HTTPS URL"):
        pull(f"{registry.host}/team/agent:v1", tmp_path, settings(registry.host),
             credentials=RIGHT)
    assert token_registry.tokens.issued == issued


def test_challenges_are_parsed_as_registries_send_them() -> None:
    challenge = parse_challenge('Bearer realm="https://auth.docker.io/token",'
                                'service="registry.docker.io",scope="repository:library/'
                                'python:pull"')
    assert challenge is not None and challenge.scheme == "bearer"
    assert challenge.params == {"realm": "https://auth.docker.io/token",
                                "service": "registry.docker.io",
                                "scope": "repository:library/python:pull"}
    basic = parse_challenge('Basic realm="a \\"quoted\\" realm"')
    assert basic is not None and basic.scheme == "basic"
    assert basic.params == {"realm": 'a "quoted" realm'}
    assert parse_challenge("") is None


def test_a_password_is_never_in_a_credentials_repr() -> None:
    assert PASSWORD not in repr(RIGHT)
