"""`pandastack doctor`'s check of the key that seals teams' registry credentials
(server/registries/sealing.py): the file `pandastack setup` made, private to the user the
server runs as, a key of the right form, and the key that sealed the credentials the database
holds (one is opened, never shown). Reads only: the database as check_database opens it."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .doctor_model import Context, Finding, Status, unconfigured

if TYPE_CHECKING:
    from pandastack.server.registries.sealing import SecretBox

CHECK = "encryption key"
SETUP_FIX = ("run `pandastack setup` (it makes the key, mode 0600; "
             "PANDASTACK_ENCRYPTION_KEY_FILE names another path), then restart the server")
LOST_BUILDS = ("this server cannot serve image builds that need them (each answers 409: log "
               "in again)")


@dataclass(frozen=True)
class Stored:
    """What the database holds: how many credentials, how many sealed by another key, and
    whether the newest one this key should open does."""

    total: int
    other_key: int = 0
    opens: bool | None = None  # None: none sealed by this key to try


def stored_credentials(dsn: str, box: SecretBox | None) -> Stored | str:
    """The database's registry credentials, read only; a string says why they could not be
    read (the database check says what to do about it)."""
    from sqlalchemy import create_engine, func, inspect, select
    from sqlalchemy.engine import make_url

    from pandastack.server.registries.sealing import UnsealError
    from pandastack.server.registries.service import row_context
    from pandastack.server.store.db import normal_dsn
    from pandastack.server.store.registry_credentials import RegistryCredential as Row

    try:
        url = make_url(normal_dsn(dsn))
    except Exception as exc:  # the database check reports it
        return f"PANDASTACK_DB is not a database URL ({exc})"
    connect_args: dict[str, object] = {"connect_timeout": 5}
    if url.get_backend_name() == "sqlite":
        path = Path(url.database or "")
        if not url.database or url.database == ":memory:" or not path.exists():
            return Stored(0)  # a database made at the first start holds none
        url = url.set(database=f"file:{path}", query={"mode": "ro", "uri": "true"})
        connect_args = {"timeout": 5}
    try:
        engine = create_engine(url, connect_args=connect_args)
    except Exception as exc:  # no such dialect, or its driver not installed
        return str(exc)[:200]
    try:
        with engine.connect() as conn:
            if not inspect(conn).has_table(Row.__tablename__):
                return Stored(0)
            total = conn.scalar(select(func.count()).select_from(Row)) or 0
            if box is None:
                return Stored(total)
            other = conn.scalar(select(func.count()).select_from(Row)
                                .where(Row.key_id != box.key_id)) or 0
            newest = conn.execute(select(Row.team, Row.registry_host.label("host"), Row.username,
                                         Row.secret)
                                  .where(Row.key_id == box.key_id)
                                  .order_by(Row.updated_at.desc()).limit(1)).first()
    except Exception as exc:  # the driver's own errors: the database check names them
        return str(getattr(exc, "orig", None) or exc).strip().splitlines()[0][:200]
    finally:
        engine.dispose()
    if newest is None:
        return Stored(total, other)
    try:
        box.open(newest.secret, row_context(newest.team, newest.host,
                                            newest.username))
    except UnsealError:
        return Stored(total, other, opens=False)
    return Stored(total, other, opens=True)


def _file_problem(path: Path) -> tuple[Status, str, str] | None:
    """(status, summary, fix) for a key file that is there but not as setup made it."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        return "fail", f"{path} cannot be read ({exc.strerror})", f"check {path.parent}'s mode"
    if not stat.S_ISREG(info.st_mode):
        return "fail", f"{path} is not a regular file (a symlink is not followed)", \
            f"put the key file itself at {path}, or name it in PANDASTACK_ENCRYPTION_KEY_FILE"
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        return "fail", f"{path} is readable by others (mode {mode:04o}): the server refuses " \
            "it, so registry credentials are off", f"chmod 600 {path}"
    if info.st_uid != os.geteuid():
        return "warn", f"{path} is owned by uid {info.st_uid}, not by this user " \
            f"(uid {os.geteuid()})", f"chown {os.geteuid()} {path} (the server reads it as " \
            "the user it runs as)"
    return None


def check_encryption_key(ctx: Context) -> Finding:
    if ctx.settings is None:
        return unconfigured(CHECK)
    from pandastack.server.registries.sealing import KeyFileError, load_key

    path = ctx.settings.encryption_key_path
    dsn = ctx.settings.dsn
    if not os.path.lexists(path):
        stored = stored_credentials(dsn, None)
        if isinstance(stored, Stored) and stored.total:
            return Finding(CHECK, "fail", f"no key at {path}, and the database holds "
                           f"{stored.total} registry credentials: {LOST_BUILDS}",
                           f"put back the key file that sealed them (from your backup); "
                           f"without it, {SETUP_FIX} and have each team log in again")
        return Finding(CHECK, "warn", f"no key at {path}: registry credentials are off (a "
                       "login answers 503)", SETUP_FIX)
    problem = _file_problem(path)
    if problem is not None and problem[0] == "fail":
        return Finding(CHECK, "fail", problem[1], problem[2])
    try:
        box = load_key(path)
    except KeyFileError as exc:
        return Finding(CHECK, "fail", str(exc),
                       "put back the key file from your backup; without one, move this one "
                       f"away and {SETUP_FIX} (stored credentials must then be logged in "
                       "again)")
    stored = stored_credentials(dsn, box)
    if isinstance(stored, str):
        found = f"{path}, key {box.key_id} (stored credentials not checked: {stored})"
    elif stored.opens is False or stored.other_key:
        why = ("does not open the newest stored credential" if stored.opens is False else
               f"did not seal {stored.other_key} of the {stored.total} stored credentials")
        return Finding(CHECK, "fail", f"the key at {path} {why} (the key file was replaced, or "
                       f"the rows altered): {LOST_BUILDS}",
                       "put back the key file that sealed them (from your backup); without "
                       "it, have each team log in again to those registries")
    else:
        found = f"{path}, key {box.key_id}" + (
            f", sealed the {stored.total} stored registry credentials (the newest opens)"
            if stored.total
            else ", no stored registry credentials yet")
    if problem is not None:
        return Finding(CHECK, problem[0], f"{problem[1]}; {found}", problem[2])
    return Finding(CHECK, "ok", found)
