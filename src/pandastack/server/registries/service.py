"""A team's registry credentials at the API level: stored sealed (sealing.py), listed without
their passwords, and opened for a build only for the registries its images name (never a
whole team's set: a build pulling from ghcr.io carries nothing of docker.io's)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from pathlib import Path

from pandastack.hostport.registries import RegistryLogin
from pandastack.templatespec.registry_host import normal_registry
from pandastack.wire.registries import MAX_REGISTRY_CREDENTIALS_PER_TEAM
from pandastack.wire.registries import RegistryLogin as Login

from ..store import Store
from ..store.registry_credentials import (
    RegistryCredential,
    RegistryCredentialRows,
    TooManyCredentials,
)
from ..web.errors import ApiError, conflict, not_found
from .sealing import KeyFileError, SecretBox, UnsealError, load_key

log = logging.getLogger("pandastack.server")

NO_KEY = ("registry credentials are off on this server: it has no encryption key. Its "
          "operator must run `pandastack setup` (which makes the key) and restart it")


def row_context(team: str, registry: str, username: str) -> str:
    # The row a sealed password belongs to: it opens in that row only.
    return f"registry-credentials\0{team}\0{registry}\0{username}"


def registry_param(text: str) -> str:
    """A registry from a request (a path segment), normalised; 422 otherwise."""
    try:
        return normal_registry(text)
    except ValueError as exc:
        raise ApiError(422, "validation_error", f"registry: {exc}") from None


class RegistryCredentialService:
    def __init__(self, store: Store, key_file: Path) -> None:
        self.rows = RegistryCredentialRows(store)
        self.box: SecretBox | None = None
        try:
            self.box = load_key(key_file)
        except KeyFileError as exc:
            # Serve anyway: everything else works, and each use of credentials says what
            # to run. The log has the path; answers do not.
            log.warning("%s", exc)

    def _box(self) -> SecretBox:
        if self.box is None:
            raise ApiError(503, "unavailable", NO_KEY)
        return self.box

    async def login(self, team: str, registry: str, body: Login) -> RegistryCredential:
        box = self._box()
        now = time.time()
        row = RegistryCredential(
            team=team, registry_host=registry, username=body.username,
            secret=box.seal(body.password.get_secret_value(),
                            row_context(team, registry, body.username)),
            key_id=box.key_id, created_at=now, updated_at=now)
        try:
            return await asyncio.to_thread(self.rows.put, row,
                                           MAX_REGISTRY_CREDENTIALS_PER_TEAM)
        except TooManyCredentials:
            raise conflict(f"the team holds credentials for {MAX_REGISTRY_CREDENTIALS_PER_TEAM}"
                           " registries, the most it may; log out of one first") from None

    async def list(self, team: str) -> list[RegistryCredential]:
        return await asyncio.to_thread(self.rows.of_team, team)

    async def logout(self, team: str, registry: str) -> None:
        if not await asyncio.to_thread(self.rows.delete, team, registry):
            raise not_found(f"registry credentials for {registry!r}")

    async def logins_for(self, team: str, registries: Iterable[str]) -> dict[str, RegistryLogin]:
        """The team's logins for these registries (those it has), opened for one build:
        503 without the key, 409 for a row another key sealed (or altered)."""
        rows = await asyncio.to_thread(self.rows.of, team, registries)
        if not rows:
            return {}
        box = self._box()
        logins: dict[str, RegistryLogin] = {}
        for row in rows:
            try:
                password = box.open(row.secret, row_context(team, row.registry_host, row.username))
            except UnsealError:
                host = row.registry_host
                why = ("another encryption key sealed them (the key file was replaced)"
                       if row.key_id != box.key_id else "they do not open (altered)")
                raise conflict(f"the stored credentials for registry {host} cannot be read: "
                               f"{why}; log in to {host} again") from None
            logins[row.registry_host] = RegistryLogin(row.username, password)
        return logins
