"""Call builders of the team's registry credentials (`/v1/registry-credentials`). No I/O:
`sdk/registries.py` runs them. The password is checked locally without ever being repeated in
an error (the wire model hides inputs, and the validation error is not chained)."""

from __future__ import annotations

import pydantic

from pandastack.sdk._base import Call, ignore_body, model_decoder, path_segment
from pandastack.sdk.errors import InvalidRequestError
from pandastack.templatespec.registry_host import normal_registry
from pandastack.wire.registries import RegistryCredentials, RegistryCredentialsList, RegistryLogin

PATH = "/v1/registry-credentials"


def _registry_path(registry: str) -> str:
    try:
        name = normal_registry(registry)
    except ValueError as exc:
        raise InvalidRequestError(f"registry: {exc}", status=422,
                                  code="validation_error") from None
    return f"{PATH}/{path_segment(name)}"


def login_call(registry: str, username: str, password: str) -> Call[RegistryCredentials]:
    path = _registry_path(registry)
    try:
        body = RegistryLogin.model_validate({"username": username, "password": password})
    except pydantic.ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                             for e in exc.errors(include_input=False))
        raise InvalidRequestError(f"invalid RegistryLogin: {problems}", status=422,
                                  code="validation_error") from None
    return Call("PUT", path, model_decoder(RegistryCredentials),
                json=body.model_dump(mode="json"))


def list_call() -> Call[list[RegistryCredentials]]:
    decode = model_decoder(RegistryCredentialsList)
    return Call("GET", PATH, lambda r: decode(r).credentials)


def logout_call(registry: str) -> Call[None]:
    return Call("DELETE", _registry_path(registry), ignore_body)
