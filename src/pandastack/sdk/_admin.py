"""Call builders of the admin namespaces: API keys and hosts (`client.keys`, `client.hosts`)."""

from __future__ import annotations

import httpx

from pandastack.sdk._base import (
    DRAIN_TIMEOUT_SECONDS,
    Call,
    encode,
    ignore_body,
    list_decoder,
    model_decoder,
    path_segment,
    with_read_timeout,
)
from pandastack.wire import resources as wire
from pandastack.wire.resources import CreatedKey, DrainResult, HostInfo, KeyInfo


def create_key_call(name: str, team: str | None) -> Call[CreatedKey]:
    return Call("POST", "/v1/keys", model_decoder(CreatedKey),
                json=encode(wire.CreateKey, name=name, team=team))


def list_keys_call() -> Call[list[KeyInfo]]:
    return Call("GET", "/v1/keys", list_decoder(wire.KeyList, "keys", KeyInfo))


def revoke_key_call(key_id: str) -> Call[None]:
    return Call("DELETE", f"/v1/keys/{path_segment(key_id)}", ignore_body)


def host_path(host_id: str, *parts: str) -> str:
    return "/".join(["/v1/hosts", path_segment(host_id), *parts])


def list_hosts_call() -> Call[list[HostInfo]]:
    return Call("GET", "/v1/hosts", list_decoder(wire.HostList, "hosts", HostInfo))


def get_host_call(host_id: str) -> Call[HostInfo]:
    return Call("GET", host_path(host_id), model_decoder(HostInfo))


def drain_host_call(host_id: str, *, base_timeout: httpx.Timeout) -> Call[DrainResult]:
    return Call("POST", host_path(host_id, "drain"), model_decoder(DrainResult), json={},
                timeout=with_read_timeout(base_timeout, DRAIN_TIMEOUT_SECONDS))


def undrain_host_call(host_id: str) -> Call[HostInfo]:
    return Call("POST", host_path(host_id, "undrain"), model_decoder(HostInfo), json={})
