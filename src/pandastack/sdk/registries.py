"""`client.registries`: the team's credentials for image registries; sync and async.

    client.registries.login("ghcr.io", "acme-bot", os.environ["GHCR_TOKEN"])
    client.templates.build("FROM ghcr.io/acme/agent-env:4\\nRUN make\\n", "agent")

Template builds FROM an image of a registry the team logged in to pull with its credentials
(basic auth or the registry's token service). The server keeps the password encrypted and
never shows it again: `list()` names registries and usernames only.
"""

from __future__ import annotations

import builtins

from pandastack.sdk import _base
from pandastack.sdk._http import HTTP, AsyncHTTP
from pandastack.sdk._registries import list_call, login_call, logout_call
from pandastack.wire.registries import RegistryCredentials

__all__ = ["AsyncRegistries", "Registries", "RegistryCredentials"]


class Registries(_base.ClientBase[HTTP]):
    """`client.registries`: the team's registry credentials."""

    def login(self, registry: str, username: str, password: str) -> RegistryCredentials:
        """Store the team's credentials for `registry` (host[:port]; `docker.io` for Docker
        Hub), replacing any it had."""
        return self._http.run(login_call(registry, username, password))

    def list(self) -> builtins.list[RegistryCredentials]:
        """The registries the team has credentials for, with their usernames (never the
        passwords)."""
        return self._http.run(list_call())

    def logout(self, registry: str) -> None:
        """Delete the team's credentials for `registry` (`NotFoundError` if it has none)."""
        self._http.run(logout_call(registry))


class AsyncRegistries(_base.ClientBase[AsyncHTTP]):
    """`client.registries`: the team's registry credentials (async)."""

    async def login(self, registry: str, username: str, password: str) -> RegistryCredentials:
        """Store the team's credentials for `registry` (host[:port]; `docker.io` for Docker
        Hub), replacing any it had."""
        return await self._http.run(login_call(registry, username, password))

    async def list(self) -> builtins.list[RegistryCredentials]:
        """The registries the team has credentials for, with their usernames (never the
        passwords)."""
        return await self._http.run(list_call())

    async def logout(self, registry: str) -> None:
        """Delete the team's credentials for `registry` (`NotFoundError` if it has none)."""
        await self._http.run(logout_call(registry))
