"""Wire types of a team's registry credentials (`/v1/registry-credentials`), shared by the server
and the SDK: a team stores a username and password per registry, and its template builds pull
images from that registry with them. The password goes one way: it is never in an answer, a
repr or a validation error (`hide_input_in_errors`). Times are UNIX seconds."""

from __future__ import annotations

from pydantic import ConfigDict, Field, SecretStr, field_serializer, field_validator

from pandastack.templatespec.registry_host import MAX_REGISTRY_LENGTH
from pandastack.wire.base import Strict

__all__ = ["RegistryCredentials", "RegistryCredentialsList"]

MAX_REGISTRY_CREDENTIALS_PER_TEAM = 32
MAX_REGISTRY_USERNAME = 256
# Long enough for a cloud's JSON service-account key sent as the password (GCP's
# `_json_key` is ~2.3 KB).
MAX_REGISTRY_PASSWORD = 8192


def _printable(value: str) -> bool:
    return not any(ord(c) < 32 or ord(c) == 127 for c in value)


class RegistryLogin(Strict):
    """What a team sends to store its credentials for a registry."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    username: str = Field(min_length=1, max_length=MAX_REGISTRY_USERNAME)
    password: SecretStr = Field(min_length=1, max_length=MAX_REGISTRY_PASSWORD, description=(
        "the password or access token; stored encrypted, never shown again"))

    @field_validator("username")
    @classmethod
    def _username(cls, value: str) -> str:
        # Basic auth joins them with a colon: a username holding one would be read as less.
        if ":" in value or not _printable(value):
            raise ValueError("a username has no colon and no control characters")
        return value

    @field_validator("password")
    @classmethod
    def _password(cls, value: SecretStr) -> SecretStr:
        if not _printable(value.get_secret_value()):
            raise ValueError("a password has no control characters (a trailing newline "
                             "from a file or stdin included)")
        return value

    @field_serializer("password", when_used="json")
    def _send(self, value: SecretStr) -> str:
        return value.get_secret_value()


class RegistryCredentials(Strict):
    """A team's credentials for one registry, as it is shown: never the password."""

    registry: str = Field(max_length=MAX_REGISTRY_LENGTH, description=(
        "host[:port] (`docker.io` for Docker Hub)"))
    username: str
    created_at: float
    updated_at: float


class RegistryCredentialsList(Strict):
    credentials: list[RegistryCredentials]

