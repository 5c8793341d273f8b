"""E2B's request bodies as our wire types, and our rows as E2B's response shapes. Pure: no
service calls, so each mapping is unit-tested on its own."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import ValidationError

from pandastack.rules import SNAPSHOT_ID_RE
from pandastack.server.routes.deps import check_text
from pandastack.wire.sandboxes import CreateSandbox, NetworkSpec, SandboxInfo
from pandastack.wire.sandboxes import VolumeMount as OurMount

from ..errors import E2bError
from ..target import ENVD_VERSION
from ..tokens import SandboxTokens
from .models import EgressRules, NetworkConfig, NetworkUpdate, NewSandbox, VolumeMount
from .states import alias_of, e2b_state, our_template

# E2B's spelling of "every address" in allowOut / denyOut (e2b.sandbox.network.ALL_TRAFFIC).
ALL_TRAFFIC = frozenset({"0.0.0.0/0", "::/0"})
# E2B's defaults when a body names no timeout: NewSandboxV2 and ConnectSandboxV2 (300 s),
# the older NewSandbox (15 s).
E2B_DEFAULT_TIMEOUT = 300
E2B_V1_DEFAULT_TIMEOUT = 15
M = TypeVar("M")


def bad(message: str) -> E2bError:
    return E2bError(400, message)


def unsupported(what: str) -> E2bError:
    return E2bError(400, f"{what} is not supported by pandastack")


def validated(build: Callable[[], M]) -> M:
    """Our wire model built from E2B's fields: its own checks (entry sizes, NUL bytes, name
    patterns) fail as E2B's 400, never as an exception out of the route."""
    try:
        return build()
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        raise bad(f"{loc or 'body'}: {err.get('msg', 'invalid')}") from None


def _egress(allow_out: list[str] | None, deny_out: list[str] | None,
            internet: bool | None) -> dict[str, Any]:
    """E2B's egress lists as our NetworkSpec fields (only those the request set). E2B denies
    everything with `denyOut: ["0.0.0.0/0"]` and lets `allowOut` entries through it: ours is
    `internet: false` with the same `allow_out`. An `allowOut` of everything is `internet:
    true` (our always-denied ranges stay closed, as they do for every sandbox)."""
    fields: dict[str, Any] = {}
    if internet is not None:
        fields["internet"] = internet
    if deny_out is not None:
        if ALL_TRAFFIC & set(deny_out):
            fields["internet"] = False
        fields["deny_out"] = [d for d in deny_out if d not in ALL_TRAFFIC]
    if allow_out is not None:
        if ALL_TRAFFIC & set(allow_out):
            fields["internet"] = True
        fields["allow_out"] = [a for a in allow_out if a not in ALL_TRAFFIC]
    return fields


def _refuse_unsupported(net: EgressRules) -> None:
    if net.rules:
        raise unsupported("network.rules (per-host request transforms)")
    if net.egress_proxy is not None:
        raise unsupported("network.egressProxy")
    if isinstance(net, NetworkConfig):
        if net.allow_public_traffic:
            # Our sandbox ports always need a credential: E2B's traffic access token (every
            # sandbox has one, `trafficAccessToken`), or one of our signed URLs.
            raise bad("network.allowPublicTraffic: true is not supported by pandastack: a "
                      "sandbox's ports always need the sandbox's trafficAccessToken "
                      "(E2B-Traffic-Access-Token header) or a signed URL")
        if net.mask_request_host is not None:
            raise unsupported("network.maskRequestHost")
        if net.https_ports:
            raise unsupported("network.httpsPorts")


def network_spec(body: NewSandbox) -> NetworkSpec | None:
    """Our egress policy for a create; None: the default (internet on, no lists)."""
    net = body.network
    if net is not None:
        _refuse_unsupported(net)
    # dnsServers only opens E2B's firewall to resolvers; ours resolves on the host and judges
    # names by TLS SNI / HTTP Host, so there is nothing to open.
    fields = _egress(net.allow_out if net else None, net.deny_out if net else None,
                     None if body.allow_internet_access is None
                     else body.allow_internet_access)
    if body.allow_internet_access is False:
        fields["internet"] = False
    if not fields:
        return None
    return validated(lambda: NetworkSpec(**fields))


def network_update(current: NetworkSpec, body: NetworkUpdate) -> NetworkSpec:
    """The policy after E2B's network update: the fields it sets replace ours."""
    _refuse_unsupported(body)
    fields = _egress(body.allow_out, body.deny_out, body.allow_internet_access)
    return validated(lambda: NetworkSpec.model_validate({**current.model_dump(), **fields}))


def ttl_of(timeout: int | None, default: int = E2B_DEFAULT_TIMEOUT) -> int:
    """E2B's timeout (seconds from now; 0 allowed) as our TTL (at least a second)."""
    return max(1, default if timeout is None else timeout)


def _mount(m: VolumeMount) -> OurMount:
    return validated(lambda: OurMount(name=m.name, mount_path=m.path))


def create_request(body: NewSandbox, default_timeout: int) -> CreateSandbox:
    """Our create for E2B's. `autoPause` is the row's `on_expiry` (set by the route once the
    row exists: lifecycle.decide hibernates the sandbox at its timeout instead of ending
    it); `autoResume` is the suffix lifecycle.WAKE on it (the listener wakes such a
    hibernated sandbox on traffic; without it, only connect does).
    `secure` changes nothing: every sandbox has its tokens."""
    if body.mcp is not None:
        raise unsupported("mcp (E2B's MCP gateway in the sandbox)")
    if body.iam is not None:
        raise unsupported("iam (workload identity tokens)")
    check_text(body.env_vars, "envVars")  # what a guest process could not take: 400 now
    template = body.template_id
    snapshot = template if SNAPSHOT_ID_RE.match(template) else None
    mounts = [_mount(m) for m in body.volume_mounts or ()]
    network = network_spec(body)
    return validated(lambda: CreateSandbox(
        template=None if snapshot else our_template(template), snapshot=snapshot,
        ttl_seconds=ttl_of(body.timeout, default_timeout),
        env=dict(body.env_vars or {}),
        metadata=dict(body.metadata or {}), network=network, volumes=mounts))


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def domain_of(preview_base: tuple[str, str, int | None]) -> str:
    """The domain the SDK puts sandbox hosts under (`{port}-{id}.{domain}`): the
    sandbox-port listener's, with its port when it is not the scheme's."""
    _, host, port = preview_base
    return host if port is None else f"{host}:{port}"


def created(info: SandboxInfo, tokens: SandboxTokens, domain: str) -> dict[str, Any]:
    """E2B's `Sandbox`: what create, connect, resume and fork answer."""
    return {
        "templateID": info.template, "sandboxID": info.id,
        "clientID": info.host_id or "pandastack", "envdVersion": ENVD_VERSION,
        "alias": alias_of(info.template),
        "envdAccessToken": tokens.envd_access(info.id),
        "trafficAccessToken": tokens.traffic_access(info.id), "domain": domain,
    }


def listed(info: SandboxInfo) -> dict[str, Any]:
    """E2B's `ListedSandbox`."""
    ends = info.created_at + info.ttl_seconds
    return {
        "templateID": info.template, "alias": alias_of(info.template), "sandboxID": info.id,
        "clientID": info.host_id or "pandastack", "startedAt": rfc3339(info.created_at),
        "endAt": rfc3339(ends), "cpuCount": info.vcpus, "memoryMB": info.memory_mb,
        "diskSizeMB": info.disk_mb or 0, "metadata": dict(info.metadata),
        "state": e2b_state(info.state), "envdVersion": ENVD_VERSION,
        "volumeMounts": [{"name": v.name, "path": v.mount_path} for v in info.volumes],
    }


def lifecycle(kept: bool, wakes: bool = False) -> dict[str, Any]:
    """E2B's `lifecycle` of a sandbox whose timeout hibernates it (`kept`; `wakes`: traffic
    to its ports wakes it), or ends it."""
    return ({"onTimeout": "pause", "autoResume": wakes} if kept
            else {"onTimeout": "kill", "autoResume": False})


def detail(info: SandboxInfo, tokens: SandboxTokens, domain: str,
           network: NetworkSpec | None, kept: bool, wakes: bool = False) -> dict[str, Any]:
    """E2B's `SandboxDetail`; `network` None: not known now (its host is out of reach)."""
    body = {**listed(info), "envdAccessToken": tokens.envd_access(info.id), "domain": domain,
            "lifecycle": lifecycle(kept or info.persistent, wakes)}
    if network is not None:
        body["allowInternetAccess"] = network.internet
        # Internet off reads as E2B spells it: everything denied, the allow list through it.
        denied = ([] if network.internet else ["0.0.0.0/0"]) + list(network.deny_out)
        body["network"] = {"allowOut": list(network.allow_out), "denyOut": denied,
                           "allowPublicTraffic": False}
    return body


def metric(m: Any, at: float) -> dict[str, Any]:
    """E2B's `SandboxMetric` of our guest measurement (`SandboxMetrics`)."""
    return {"timestamp": rfc3339(at), "timestampUnix": int(at), "cpuCount": m.cpu_count,
            "cpuUsedPct": m.cpu_percent, "memUsed": m.memory_used_bytes,
            "memTotal": m.memory_total_bytes, "memCache": 0, "diskUsed": m.disk_used_bytes,
            "diskTotal": m.disk_total_bytes}
