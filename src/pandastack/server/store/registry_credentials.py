"""A team's registry credentials: one row per (team, registry), the password sealed
(server/registries/sealing.py: `secret` opens only with the operator's key and only in its own
row). The queries take the team, so one team never reaches another's rows."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Float, ForeignKey, String, Text, delete, func, inspect, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, mapped_column

from pandastack.registry.models import Base

from .repo import Store


class RegistryCredential(Base):
    __tablename__ = "registry_credentials"

    team: Mapped[str] = mapped_column(String(128), ForeignKey("teams.id"), primary_key=True)
    # Not `registry`: declarative classes keep that attribute name for their mapper registry.
    registry_host: Mapped[str] = mapped_column("registry", String(255), primary_key=True)
    username: Mapped[str] = mapped_column(String(256))
    # The password, sealed: "v1." + base64(nonce + AES-GCM ciphertext and tag).
    secret: Mapped[str] = mapped_column(Text)
    # Which key sealed it (a hash of the key): a key file replaced since is named as such.
    key_id: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


COLUMNS = [attr.key for attr in inspect(RegistryCredential).column_attrs]


class TooManyCredentials(Exception):
    """The team holds the most registries' credentials it may (the API's 409)."""


class RegistryCredentialRows:
    def __init__(self, store: Store) -> None:
        self.store = store

    def put(self, row: RegistryCredential, max_per_team: int) -> RegistryCredential:
        """Insert the row, or replace the username and secret of the team's row for that
        registry (keeping its created_at). TooManyCredentials when it would be one too
        many."""
        try:
            return self._put(row, max_per_team)
        except IntegrityError:  # a login to the same registry inserted it meanwhile
            return self._put(row, max_per_team)

    def _put(self, row: RegistryCredential, max_per_team: int) -> RegistryCredential:
        with self.store.session() as s:
            self.store.ensure_team(s, row.team)
            old = s.get(RegistryCredential, (row.team, row.registry_host), with_for_update=True)
            if old is not None:
                old.username, old.secret, old.key_id = row.username, row.secret, row.key_id
                old.updated_at = row.updated_at
                return old
            held = s.scalar(select(func.count()).select_from(RegistryCredential)
                            .where(RegistryCredential.team == row.team)) or 0
            if held >= max_per_team:
                raise TooManyCredentials
            fresh = RegistryCredential(**{c: getattr(row, c) for c in COLUMNS})
            s.add(fresh)
            return fresh

    def of_team(self, team: str) -> list[RegistryCredential]:
        with self.store.session() as s:
            return list(s.scalars(select(RegistryCredential)
                                  .where(RegistryCredential.team == team)
                                  .order_by(RegistryCredential.registry_host)))

    def of(self, team: str, registries: Iterable[str]) -> list[RegistryCredential]:
        wanted = sorted(set(registries))
        if not wanted:
            return []
        with self.store.session() as s:
            return list(s.scalars(select(RegistryCredential).where(
                RegistryCredential.team == team, RegistryCredential.registry_host.in_(wanted))))

    def delete(self, team: str, registry: str) -> bool:
        with self.store.session() as s:
            gone = s.execute(delete(RegistryCredential).where(
                RegistryCredential.team == team, RegistryCredential.registry_host == registry))
            return bool(getattr(gone, "rowcount", 0))
