"""Server settings, read from the environment (`PANDASTACK_*`) with safe defaults."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit

from pandastack.hostport.network import operator_allow_from, parse_cidrs
from pandastack.rules import DEFAULT_EXEC_OUTPUT_MB, DEFAULT_HOME, MAX_EXEC_OUTPUT_MB

from .accounts.metering import DEFAULT_SIZE_CLASSES, QuotaDefaults, Rates, settings_from_env


def _default_client_config() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "pandastack" / "config.json"


def _cidrs(entries: tuple[str, ...]) -> tuple[str, ...]:
    """CIDRs (IPv4 or IPv6) in canonical form; ValueError naming a bad one."""
    out: list[str] = []
    for entry in entries:
        try:
            out.append(str(ipaddress.ip_network(entry.strip(), strict=False)))
        except ValueError:
            raise ValueError(f"webhook_allow_cidrs: {entry!r} is not a CIDR") from None
    return tuple(out)


@dataclass(frozen=True)
class Settings:
    """Everything the control plane needs to know; `from_env()` is what `serve` uses."""

    home: Path = DEFAULT_HOME
    state_dir: Path | None = None
    db_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    public_url: str | None = None
    idle_timeout_seconds: int = 600
    # Idle *persistent* sandboxes are hibernated after this many seconds without API activity
    # (None: never). Non-persistent ones are still reaped after `idle_timeout_seconds`.
    hibernate_idle_seconds: int | None = None
    retention_seconds: int = 3600
    reaper_interval_seconds: float = 1.0
    # At start, VMs a host runs that this database has no row for at all (a database restored
    # from an older backup, another server's database sharing the host) are reported and left
    # running; True kills them, as rows-less VMs were before (ADR 0047, addendum).
    kill_unknown_vms: bool = False
    max_upload_bytes: int = 1024 << 20
    max_body_bytes: int = 1 << 20
    # A template build's body holds its COPY files, base64 (the spec allows 64 MiB of files).
    max_template_bytes: int = 96 << 20
    # Template build step cache entries kept (newest used first); each holds a snapshot.
    build_cache_entries: int = 32
    # Template builds running at once (each is a VM); more wait their turn.
    max_concurrent_builds: int = 2
    # What one team may hold at once on this server (server/accounts/team_slots.py): commands
    # running (exec, exec/stream), streams and terminals attached (a process's output, a
    # watch, a terminal), and build slots of the `max_concurrent_builds` (its further builds
    # wait for its own, so another team always finds one free).
    max_execs_per_team: int = 64
    max_streams_per_team: int = 32
    max_builds_per_team: int = 1
    # What one exec's result keeps of each of its stdout and stderr (the rest is counted,
    # not held, and the result says `truncated`); a request may ask for less
    # (`max_output_bytes`), never more.
    max_exec_output_bytes: int = DEFAULT_EXEC_OUTPUT_MB << 20
    # Stopping (SIGTERM): requests in flight get this long to end, streams and terminals
    # included, before they are cut; with `hibernate_on_stop`, a server whose host is in its
    # own process (`serve` without agents) then hibernates its persistent running sandboxes,
    # so a host reboot after it loses none of their memory. Other VMs keep running either
    # way, and the next start adopts them.
    stop_grace_seconds: int = 10
    hibernate_on_stop: bool = False
    rate_limit_per_second: float = 50.0
    rate_limit_burst: int = 200
    logs_max_bytes: int = 64 << 10
    # Exposed ports: how long to wait for the sandbox's server to accept a connection, and
    # for each read from it (between chunks of a streamed response).
    port_connect_timeout_seconds: float = 5.0
    port_read_timeout_seconds: float = 300.0
    # The HMAC key of signed port URLs; None: generated once and kept in the database.
    url_signing_secret: str | None = None
    # Sandbox ports on their own origin (server/preview/listener.py): the listener's port (None: the
    # API's port + 1; 0: no listener, so no signed URLs) and the address users reach it at,
    # whose host name is the wildcard domain (`{port}-{sandbox id}.{domain}`); None:
    # http://localhost:{listener port} (browsers resolve *.localhost to loopback).
    preview_port: int | None = None
    preview_url: str | None = None
    client_config_path: Path = field(default_factory=_default_client_config)
    write_client_config: bool = True
    # CIDRs of the always-denied ranges (private, loopback, link-local/metadata, CGNAT,
    # multicast) that tenants may open with allow_out; a request reaching into any other
    # part of them is refused (422). The host runtime enforces the same list.
    network_operator_allow: tuple[str, ...] = ()
    # Separately started `pandastack agent`s ("unix:/path/to.sock" or "http://host:port",
    # comma-separated for a pool of hosts) and the file holding their token (None: each
    # agent's own, beside its socket); None: the host runs inside this process.
    agent: str | None = None
    agent_token_file: Path | None = None
    # TLS (ADR 0048). The API's certificate and key (None: plain HTTP, for loopback or a
    # terminating proxy in front); the sandbox listener's wildcard certificate (`*.{domain}`
    # of `preview_url`), presented to clients that ask for a name under that domain (SNI),
    # the API's to others. Agents at https:// addresses are verified with `agent_ca` (None:
    # the system's CAs), and `agent_client_cert`/`_key` are presented to agents that ask
    # for a client certificate (mutual TLS).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    sandbox_tls_cert: Path | None = None
    sandbox_tls_key: Path | None = None
    agent_ca: Path | None = None
    agent_client_cert: Path | None = None
    agent_client_key: Path | None = None
    # Drive the agents the database's host registry names instead of a host in this process
    # (`serve --no-local-agent`; needs a shared database, `db_url`). A host whose heartbeat
    # is older than `host_stale_seconds` by the database's clock is lost.
    cluster: bool = False
    host_stale_seconds: float = 15.0
    # Metering (accounts/metering.py, ADR 0025): the rate card, the quota of a team that has none of
    # its own, and the (vcpus, memory_mb) shapes a sandbox or template build may have.
    rates: Rates = field(default_factory=Rates)
    quota_defaults: QuotaDefaults = field(default_factory=QuotaDefaults)
    size_classes: tuple[tuple[int, int], ...] = DEFAULT_SIZE_CLASSES
    # Events and webhooks (server/events/log.py, server/events/webhooks.py, ADR 0035): how long the
    # log keeps events, the SSE streams a team may hold open on this server, and which
    # webhook targets outside the public internet the operator lets through (all of them,
    # or these CIDRs); a delivery is retried for `webhook_retry_seconds`.
    event_retention_seconds: int = 86400
    max_event_streams_per_team: int = 10
    webhook_allow_private: bool = False
    webhook_allow_cidrs: tuple[str, ...] = ()
    webhook_retry_seconds: float = 86400.0
    webhook_timeout_seconds: float = 10.0
    # The operator's key that encrypts team secrets at rest (registry passwords;
    # server/registries/sealing.py), made by `pandastack setup`; None: `<home>/encryption.key`.
    encryption_key_file: Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "network_operator_allow",
                           parse_cidrs(self.network_operator_allow))
        if self.idle_timeout_seconds < 1:
            raise ValueError("idle_timeout_seconds must be >= 1")
        if self.hibernate_idle_seconds is not None and self.hibernate_idle_seconds < 1:
            raise ValueError("hibernate_idle_seconds must be >= 1 (or None: off)")
        if self.event_retention_seconds < 60 or self.max_event_streams_per_team < 1:
            raise ValueError("event_retention_seconds must be >= 60, "
                             "max_event_streams_per_team >= 1")
        object.__setattr__(self, "webhook_allow_cidrs", _cidrs(self.webhook_allow_cidrs))
        if self.retention_seconds < 0:
            raise ValueError("retention_seconds must be >= 0")
        if self.reaper_interval_seconds <= 0:
            raise ValueError("reaper_interval_seconds must be > 0")
        if self.max_upload_bytes < 1:
            raise ValueError("max_upload_bytes must be >= 1")
        if self.max_body_bytes < 1:
            raise ValueError("max_body_bytes must be >= 1")
        if self.build_cache_entries < 0:
            raise ValueError("build_cache_entries must be >= 0")
        if self.max_concurrent_builds < 1:
            raise ValueError("max_concurrent_builds must be >= 1")
        if self.stop_grace_seconds < 0:
            raise ValueError("stop_grace_seconds must be >= 0")
        if min(self.max_execs_per_team, self.max_streams_per_team,
               self.max_builds_per_team) < 1:
            raise ValueError("max_execs_per_team, max_streams_per_team and "
                             "max_builds_per_team must be >= 1")
        if not 1 <= self.max_exec_output_bytes <= MAX_EXEC_OUTPUT_MB << 20:
            raise ValueError(f"max_exec_output_bytes must be between 1 and "
                             f"{MAX_EXEC_OUTPUT_MB} MiB (PANDASTACK_MAX_EXEC_OUTPUT_MB)")
        if self.rate_limit_per_second <= 0 or self.rate_limit_burst < 1:
            raise ValueError("rate limit must be positive")
        if self.port_connect_timeout_seconds <= 0 or self.port_read_timeout_seconds <= 0:
            raise ValueError("port proxy timeouts must be > 0")
        if self.url_signing_secret is not None and len(self.url_signing_secret) < 16:
            raise ValueError("url_signing_secret must have at least 16 characters")
        for cert, key, what in (
                (self.tls_cert, self.tls_key, "tls_cert and tls_key"),
                (self.sandbox_tls_cert, self.sandbox_tls_key,
                 "sandbox_tls_cert and sandbox_tls_key"),
                (self.agent_client_cert, self.agent_client_key,
                 "agent_client_cert and agent_client_key")):
            if (cert is None) != (key is None):
                raise ValueError(f"{what} go together: give both or neither")
        if self.sandbox_tls_cert is not None and self.tls_cert is None:
            raise ValueError("the sandbox listener shares the API's server: a sandbox "
                             "certificate needs tls_cert and tls_key too")
        if self.host_stale_seconds <= 0:
            raise ValueError("host_stale_seconds must be > 0")
        if self.cluster and self.agent is not None:
            raise ValueError("the hosts of a cluster come from its database: no --agent")
        if not 0 < self.port < 65536:
            raise ValueError("port must be between 1 and 65535")
        if self.preview_port is not None and not 0 <= self.preview_port < 65536:
            raise ValueError("preview_port must be between 0 (none) and 65535")
        if self.preview_url is not None:
            parts = urlsplit(self.preview_url)
            if parts.scheme not in ("http", "https") or not parts.hostname or \
                    parts.path not in ("", "/") or parts.query:
                raise ValueError("preview_url must be http(s)://DOMAIN[:PORT] (no path): the "
                                 "wildcard domain of the sandboxes' ports")

    @property
    def agents(self) -> list[str]:
        """The agents `agent` names (comma-separated), in order."""
        return [a.strip() for a in (self.agent or "").split(",") if a.strip()]

    @property
    def encryption_key_path(self) -> Path:
        # Path() again: settings a test passes as JSON arrive as strings.
        return Path(self.encryption_key_file or self.home / "encryption.key")

    @property
    def dsn(self) -> str:
        return self.db_url or f"sqlite:///{self.home / 'pandastack.db'}"

    @property
    def api_url(self) -> str:
        return self.public_url or f"{self.scheme}://{self.host}:{self.port}"

    @property
    def scheme(self) -> str:
        """What the listeners speak: https with a certificate, else http."""
        return "https" if self.tls_cert is not None else "http"

    @property
    def preview_listener_port(self) -> int:
        """The preview listener's port; 0 when there is none."""
        if self.preview_port is not None:
            return self.preview_port
        return self.port + 1 if self.port < 65535 else 0

    @property
    def preview_base(self) -> tuple[str, str, int | None]:
        """(scheme, wildcard domain, public port or None for the scheme's) of port URLs."""
        url = self.preview_url or f"{self.scheme}://localhost:{self.preview_listener_port}"
        parts = urlsplit(url)
        assert parts.hostname is not None
        return parts.scheme, parts.hostname.lower(), parts.port

    def with_(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Read `PANDASTACK_*` variables; a malformed value raises ValueError naming it."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}

        def take(var: str, name: str, conv: type[int] | type[float] | type[str] | type[Path],
                 scale: int = 1) -> None:
            raw = env.get(var)
            if raw is None or raw == "":
                return
            try:
                value = conv(raw)
            except ValueError:
                raise ValueError(f"{var}={raw!r} is not a valid {conv.__name__}") from None
            values[name] = value * scale if scale != 1 else value  # type: ignore[operator]

        take("PANDASTACK_HOME", "home", Path)
        take("PANDASTACK_STATE_DIR", "state_dir", Path)
        take("PANDASTACK_DB", "db_url", str)
        take("PANDASTACK_HOST", "host", str)
        take("PANDASTACK_PORT", "port", int)
        take("PANDASTACK_PUBLIC_URL", "public_url", str)
        take("PANDASTACK_PREVIEW_PORT", "preview_port", int)
        take("PANDASTACK_PREVIEW_URL", "preview_url", str)
        take("PANDASTACK_IDLE_TIMEOUT", "idle_timeout_seconds", int)
        take("PANDASTACK_RETENTION", "retention_seconds", int)
        if env.get("PANDASTACK_HIBERNATE_IDLE", "").strip().lower() in ("off", "none", "0"):
            values["hibernate_idle_seconds"] = None
        else:
            take("PANDASTACK_HIBERNATE_IDLE", "hibernate_idle_seconds", int)
        take("PANDASTACK_MAX_UPLOAD_MB", "max_upload_bytes", int, 1 << 20)
        take("PANDASTACK_MAX_BODY_KB", "max_body_bytes", int, 1 << 10)
        take("PANDASTACK_MAX_TEMPLATE_MB", "max_template_bytes", int, 1 << 20)
        take("PANDASTACK_BUILD_CACHE_ENTRIES", "build_cache_entries", int)
        take("PANDASTACK_MAX_BUILDS", "max_concurrent_builds", int)
        take("PANDASTACK_MAX_EXECS_PER_TEAM", "max_execs_per_team", int)
        take("PANDASTACK_MAX_STREAMS_PER_TEAM", "max_streams_per_team", int)
        take("PANDASTACK_MAX_BUILDS_PER_TEAM", "max_builds_per_team", int)
        take("PANDASTACK_MAX_EXEC_OUTPUT_MB", "max_exec_output_bytes", int, 1 << 20)
        take("PANDASTACK_STOP_GRACE", "stop_grace_seconds", int)
        if env.get("PANDASTACK_HIBERNATE_ON_STOP", "").strip().lower() in (
                "1", "true", "yes", "on"):
            values["hibernate_on_stop"] = True
        take("PANDASTACK_RATE_LIMIT", "rate_limit_per_second", float)
        take("PANDASTACK_RATE_BURST", "rate_limit_burst", int)
        take("PANDASTACK_PORT_CONNECT_TIMEOUT", "port_connect_timeout_seconds", float)
        take("PANDASTACK_PORT_READ_TIMEOUT", "port_read_timeout_seconds", float)
        take("PANDASTACK_URL_SIGNING_SECRET", "url_signing_secret", str)
        take("PANDASTACK_CLIENT_CONFIG", "client_config_path", Path)
        take("PANDASTACK_AGENT", "agent", str)
        take("PANDASTACK_AGENT_TOKEN_FILE", "agent_token_file", Path)
        take("PANDASTACK_TLS_CERT", "tls_cert", Path)
        take("PANDASTACK_TLS_KEY", "tls_key", Path)
        take("PANDASTACK_SANDBOX_TLS_CERT", "sandbox_tls_cert", Path)
        take("PANDASTACK_SANDBOX_TLS_KEY", "sandbox_tls_key", Path)
        take("PANDASTACK_AGENT_CA", "agent_ca", Path)
        take("PANDASTACK_AGENT_CLIENT_CERT", "agent_client_cert", Path)
        take("PANDASTACK_AGENT_CLIENT_KEY", "agent_client_key", Path)
        take("PANDASTACK_ENCRYPTION_KEY_FILE", "encryption_key_file", Path)
        if env.get("PANDASTACK_CLUSTER", "").strip().lower() in ("1", "true", "yes", "on"):
            values["cluster"] = True
        if env.get("PANDASTACK_KILL_UNKNOWN_VMS", "").strip().lower() in (
                "1", "true", "yes", "on"):
            values["kill_unknown_vms"] = True
        take("PANDASTACK_HOST_STALE_SECONDS", "host_stale_seconds", float)
        take("PANDASTACK_EVENT_RETENTION", "event_retention_seconds", int)
        take("PANDASTACK_MAX_EVENT_STREAMS", "max_event_streams_per_team", int)
        take("PANDASTACK_WEBHOOK_RETRY", "webhook_retry_seconds", float)
        if env.get("PANDASTACK_WEBHOOK_ALLOW_PRIVATE", "").strip().lower() in (
                "1", "true", "yes", "on"):
            values["webhook_allow_private"] = True
        values["webhook_allow_cidrs"] = tuple(
            c.strip() for c in env.get("PANDASTACK_WEBHOOK_ALLOW_CIDRS", "").split(",")
            if c.strip())
        values["network_operator_allow"] = operator_allow_from(env)
        values.update(settings_from_env(env))
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]
