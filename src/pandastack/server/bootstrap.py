"""First start: make an admin key if there is none and hand it to the local user."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from .auth import create_key
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
