"""Where the SDK finds its server and key.

Each setting is resolved on its own, first match wins:

1. the explicit argument (`api_url=`, `api_key=`, `ca_bundle=`),
2. the environment (`PANDASTACK_API`, `PANDASTACK_API_KEY`, `PANDASTACK_CA_BUNDLE`),
3. the config file `~/.config/pandastack/config.json` (`$XDG_CONFIG_HOME/pandastack/...` when
   that is set): ``{"api_url": "...", "api_key": "...", "ca_bundle": "..."}``.

Empty strings count as unset. A URL or key missing everywhere raises `ConfigError`; without a
CA bundle, an https:// server is verified against the system's CAs. The file is read only
when it must give the URL or the key.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from pandastack.sdk.errors import ConfigError

__all__ = [
    "DEFAULT_TIMEOUT",
    "ENV_API_KEY",
    "ENV_API_URL",
    "ENV_CA_BUNDLE",
    "ClientConfig",
    "TimeoutTypes",
    "default_config_path",
    "resolve_config",
]

ENV_API_URL = "PANDASTACK_API"
ENV_API_KEY = "PANDASTACK_API_KEY"
ENV_CA_BUNDLE = "PANDASTACK_CA_BUNDLE"

#: HTTP timeouts of ordinary requests. `exec` and `Process.wait` raise the read timeout above
#: the command's own timeout, so long commands are never cut by this.
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)

#: What `timeout=` accepts: seconds for every phase, an `httpx.Timeout`, or None (no timeout).
TimeoutTypes = float | httpx.Timeout | None


@dataclass(frozen=True)
class ClientConfig:
    """A resolved configuration: which server, which key, which HTTP timeouts, and the CA
    bundle (PEM file) that verifies an https:// server (None: the system's CAs)."""

    api_url: str
    api_key: str = field(repr=False)
    timeout: httpx.Timeout = field(default_factory=lambda: DEFAULT_TIMEOUT)
    ca_bundle: str | None = None


def default_config_path(environ: Mapping[str, str] | None = None) -> Path:
    """The config file the SDK (and the CLI) read when nothing else is configured."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "pandastack" / "config.json"


def _read_file(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"cannot read the pandastack config file {path}: {exc}") from exc
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"the pandastack config file {path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"the pandastack config file {path} must hold a JSON object")
    return data


def _file_value(data: Mapping[str, Any], key: str, path: Path) -> str | None:
    value = data.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{key!r} in {path} must be a string")
    return value


def _normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"the pandastack API URL must start with http:// or https://, "
                          f"got {url!r}")
    return url


def resolve_config(api_url: str | None = None, api_key: str | None = None, *,
                   timeout: TimeoutTypes = DEFAULT_TIMEOUT,
                   environ: Mapping[str, str] | None = None,
                   config_path: Path | None = None,
                   ca_bundle: str | os.PathLike[str] | None = None) -> ClientConfig:
    """Resolve URL, key and CA bundle (argument > environment > config file) into a
    `ClientConfig`.

    Raises `ConfigError` naming every place it looked when a setting is missing. `environ` and
    `config_path` exist for tests; they default to `os.environ` and `default_config_path()`.
    """
    env = os.environ if environ is None else environ
    url = api_url or env.get(ENV_API_URL) or None
    key = api_key or env.get(ENV_API_KEY) or None
    ca = os.fspath(ca_bundle) if ca_bundle else env.get(ENV_CA_BUNDLE) or None
    path = config_path if config_path is not None else default_config_path(env)
    # The file's CA bundle goes with the file's server: it is not read for a URL and key
    # given otherwise (a broken file must not break a client that does not need it).
    if url is None or key is None:
        data = _read_file(path)
        url = url or _file_value(data, "api_url", path)
        key = key or _file_value(data, "api_key", path)
        ca = ca or _file_value(data, "ca_bundle", path)
    if url is None:
        raise ConfigError(f"no pandastack API URL configured: pass api_url=, set {ENV_API_URL}, "
                          f"or put \"api_url\" in {path}")
    if key is None:
        raise ConfigError(f"no pandastack API key configured: pass api_key=, set {ENV_API_KEY}, "
                          f"or put \"api_key\" in {path}")
    http_timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
    if ca is not None and not os.path.isfile(ca):
        raise ConfigError(f"the CA bundle {ca!r} (ca_bundle= or {ENV_CA_BUNDLE}) is not a file")
    return ClientConfig(api_url=_normalize_url(url), api_key=key, timeout=http_timeout,
                        ca_bundle=ca)
