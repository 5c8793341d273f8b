"""First start: make the database file private, make an admin key if there is none and hand
it to the local user."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

from sqlalchemy.engine import make_url

from .accounts.auth import create_key
from .settings import Settings
from .store import Store

log = logging.getLogger("pandastack.server")

DEFAULT_TEAM = "default"


def write_client_config(path: Path, api_url: str, api_key: str) -> None:
    """Write `{"api_url", "api_key"}` with mode 0600 in a 0700 directory (atomically)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"api_url": api_url, "api_key": api_key}, f, indent=2)
        f.write("\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def ensure_admin_key(store: Store, settings: Settings) -> str | None:
    """Create the first admin key if no usable one exists; returns it (else None)."""
    if store.has_admin_key():
        return None
    _, secret = create_key(store, "admin", DEFAULT_TEAM, admin=True)
    if settings.write_client_config:
        write_client_config(settings.client_config_path, settings.api_url, secret)
        log.warning("created the first admin API key; wrote it to %s",
                    settings.client_config_path)
    else:
        log.warning("created the first admin API key (not written anywhere: "
                    "write_client_config is off)")
    return secret


def private_database(dsn: str) -> Path | None:
    """Make a SQLite database file 0600 before SQLite opens it (it holds API key hashes, the
    URL-signing key and env values); return its path (None: not a SQLite file).

    A missing file is created empty (an empty file is an empty database), so it never exists
    with another mode: SQLite gives its -wal and -shm files the database file's mode. Those of
    an older install are made 0600 too."""
    url = make_url(dsn)
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    path = Path(url.database)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(path.with_name(path.name + suffix), 0o600)
    return path
