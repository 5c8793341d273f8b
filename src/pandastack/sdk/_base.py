"""Everything the sync and async SDK share that does no I/O.

Each REST operation is built here as a `Call`: the request to send (method, path, query, body,
timeout) plus the function that turns the success response into a value. The twins
(`Sandbox`/`AsyncSandbox`, ...) only send calls and, for streams, move the bytes; URL building,
request validation, timeouts, response and error decoding all live here, once; the call
builders of one area live beside it (`_commands` with the exec stream's decoder, `_files`,
`_admin`, `_usage`, `_metrics`; volumes.py holds its own).
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata as _metadata
from typing import Any, Generic, Literal, TypeVar
from urllib.parse import quote

import httpx
import pydantic

from pandastack.rules import DEFAULT_TEMPLATE, ERROR_STATUS, STATUS_ERROR_CODE
from pandastack.sdk._info import InfoFields
from pandastack.sdk.config import ClientConfig
from pandastack.sdk.errors import (
    APIConnectionError,
    APIError,
    InvalidRequestError,
    ProtocolError,
    QuotaExceededError,
    RateLimitError,
    TemplateBuildingError,
    TransportTimeoutError,
    exception_class,
    quota_error,
)
from pandastack.wire import sandboxes as wire
from pandastack.wire.sandboxes import (
    ForkResult,
    Lifecycle,
    Logs,
    NetworkSpec,
    ProcessInfo,
    SandboxInfo,
    SignedUrl,
    SnapshotInfo,
)

T = TypeVar("T")
M = TypeVar("M", bound=pydantic.BaseModel)
H = TypeVar("H")

#: How much longer than the command's own timeout the HTTP read timeout of exec/wait is.
EXEC_TIMEOUT_MARGIN = 30.0
#: How long a create keeps waiting for a template that is still building (a built-in template's
#: first use on a fresh host builds its image: minutes under TCG).
TEMPLATE_WAIT_SECONDS = 1800.0
#: How long a drain may take to answer: it moves the host's sandboxes one after another
#: (each a hibernation and a wake elsewhere: seconds).
DRAIN_TIMEOUT_SECONDS = 3600.0
#: Chunk size of uploads read from disk.
UPLOAD_CHUNK_SIZE = 256 * 1024

StreamName = Literal["stdout", "stderr"]

try:
    _VERSION = _metadata.version("pandastack")
except _metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    _VERSION = "0"
USER_AGENT = f"pandastack-python/{_VERSION}"


# -- calls --------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One REST request and the decoder of its success response."""

    method: str
    path: str
    decode: Callable[[httpx.Response], T]
    params: Mapping[str, str] | None = None
    json: dict[str, Any] | None = None
    content: bytes | None = None
    headers: Mapping[str, str] | None = None
    timeout: httpx.Timeout | None = None  # None: the client's timeout
    # The name of its client span where the program traces (_tracing.py); None: "METHOD".
    span: str | None = None

    @property
    def label(self) -> str:
        return f"{self.method} {self.path}"


def template_retry_delay(retry_after: float | None) -> float:
    """Seconds to wait before asking again for a template that is building."""
    return min(max(retry_after if retry_after is not None else 5.0, 1.0), 30.0)


def client_headers(config: ClientConfig) -> dict[str, str]:
    """Headers sent with every request."""
    return {"Authorization": f"Bearer {config.api_key}", "User-Agent": USER_AGENT,
            "Accept": "application/json"}


def path_segment(value: str | int) -> str:
    text = str(value)
    if not text:
        raise InvalidRequestError("an id in the URL must not be empty", status=422,
                                  code="validation_error")
    return quote(text, safe="")


def sandbox_path(sandbox_id: str, *parts: str | int) -> str:
    """`/v1/sandboxes/{id}/{parts...}` with every segment percent-encoded."""
    return "/".join(["/v1/sandboxes", path_segment(sandbox_id), *(path_segment(p) for p in parts)])


def _bool(flag: bool) -> str:
    return "true" if flag else "false"


def encode(model: type[pydantic.BaseModel], **fields: Any) -> dict[str, Any]:
    """Validate a request body locally against its wire model; None (or omitted) means "the
    server's default" and is not sent.

    Raises `InvalidRequestError` (request_id None) before anything is sent.
    """
    values = {k: v for k, v in fields.items() if v is not None}
    try:
        body = model.model_validate(values)
    except pydantic.ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}"
                             for e in exc.errors())
        raise InvalidRequestError(f"invalid {model.__name__}: {problems}", status=422,
                                  code="validation_error") from exc
    return body.model_dump(mode="json", exclude_unset=True, exclude_none=True)


def with_read_timeout(base: httpx.Timeout, seconds: float | None) -> httpx.Timeout:
    """`base` with a read timeout that outlasts a server-side wait of `seconds`.

    None (wait without limit) disables the read timeout. The read timeout never drops below the
    client's own, and stays disabled if the client disabled it.
    """
    if seconds is None or base.read is None:
        read = None
    else:
        read = max(base.read, seconds + EXEC_TIMEOUT_MARGIN)
    return httpx.Timeout(connect=base.connect, read=read, write=base.write, pool=base.pool)


def _cmd(cmd: str | Sequence[str]) -> str | list[str]:
    return cmd if isinstance(cmd, str) else list(cmd)


def _text(data: str | bytes) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


# -- decoding -----------------------------------------------------------------------------

def _prune(tp: Any, value: Any) -> Any:
    """Drop keys the wire model does not know (recursively), so newer servers stay readable."""
    if isinstance(tp, type) and issubclass(tp, pydantic.BaseModel):
        if not isinstance(value, dict):
            return value
        return {name: _prune(field.annotation, value[name])
                for name, field in tp.model_fields.items() if name in value}
    origin = typing.get_origin(tp)
    if origin is list and isinstance(value, list):
        (item,) = typing.get_args(tp)
        return [_prune(item, v) for v in value]
    if origin in (typing.Union, types.UnionType):
        models = [a for a in typing.get_args(tp)
                  if isinstance(a, type) and issubclass(a, pydantic.BaseModel)]
        if len(models) == 1:
            return _prune(models[0], value)
    return value


def parse_model(model: type[M], data: Any, where: str) -> M:
    """Validate decoded JSON as `model`, ignoring unknown fields; ProtocolError if it fails."""
    try:
        return model.model_validate(_prune(model, data))
    except pydantic.ValidationError as exc:
        raise ProtocolError(f"{where}: the reply is not a valid {model.__name__}: {exc}") from exc


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError as exc:
        raise ProtocolError(f"{response.request.method} {response.request.url.path}: "
                            f"the reply (status {response.status_code}) is not JSON") from exc


def model_decoder(model: type[M]) -> Callable[[httpx.Response], M]:
    """A `Call.decode` that reads the body as `model`."""
    def decode(response: httpx.Response) -> M:
        return parse_model(model, _json(response), response.request.url.path)
    return decode


def list_decoder(model: type[pydantic.BaseModel], field: str,
                 item: type[M]) -> Callable[[httpx.Response], list[M]]:
    """A `Call.decode` that reads a `{field: [...]}` list model and returns the list."""
    def decode(response: httpx.Response) -> list[M]:
        parsed = parse_model(model, _json(response), response.request.url.path)
        return typing.cast(list[M], list(getattr(parsed, field)))
    return decode


def ignore_body(response: httpx.Response) -> None:
    """A `Call.decode` for replies whose body carries nothing (204, or an ack)."""
    return None


# -- errors -------------------------------------------------------------------------------

# The codes, their statuses and classes are shared (pandastack.rules, sdk/errors.py).
_CODE_STATUS: dict[str, int] = {code: status for code, status in ERROR_STATUS.items()}
# A bare 502/504 (no envelope) comes from a proxy in front of the server: "unavailable".
_STATUS_CODE: dict[int, str] = {**STATUS_ERROR_CODE, 502: "unavailable", 504: "unavailable"}


def api_error(status: int, code: str | None, message: str | None, request_id: str | None,
              retry_after: float | None = None, details: Any = None) -> APIError:
    """The `APIError` subclass for an HTTP status (other 5xx: `ServerError`)."""
    code = code or _STATUS_CODE.get(status) or ("internal" if status >= 500 else "error")
    message = message or f"HTTP {status}"
    cls = exception_class(status, code)
    if cls is QuotaExceededError:
        return quota_error(message, status, code, request_id, retry_after, details)
    if cls is RateLimitError:
        return RateLimitError(message, status=status, code=code, request_id=request_id,
                              retry_after=retry_after)
    if code == "template_building":
        return TemplateBuildingError(message, status=status, code=code, request_id=request_id,
                                     retry_after=retry_after)
    return cls(message, status=status, code=code, request_id=request_id)


def _envelope(data: Any) -> tuple[str | None, str | None, str | None]:
    """(code, message, request_id) from an error envelope; Nones where it has none."""
    body = data.get("error") if isinstance(data, dict) else None
    if isinstance(body, str):  # a bare {"error": "message"}
        return None, body, None
    if not isinstance(body, dict):
        return None, None, None
    def text(key: str) -> str | None:
        value = body.get(key)
        return value if isinstance(value, str) and value else None
    return text("code"), text("message"), text("request_id")


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP-date: not worth parsing


def error_from_response(response: httpx.Response) -> APIError:
    """Decode a non-2xx response (its body must have been read) into the right `APIError`."""
    try:
        data: Any = response.json()
    except ValueError:
        data = None
    code, message, request_id = _envelope(data)
    if message is None:
        snippet = response.text.strip()[:200] if response.content else ""
        message = f"HTTP {response.status_code}" + (f": {snippet}" if snippet else "")
    request_id = request_id or response.headers.get("x-request-id")
    return api_error(response.status_code, code, message, request_id,
                     _retry_after(response.headers.get("retry-after")),
                     data.get("error") if isinstance(data, dict) else None)


def error_from_event(data: str) -> APIError:
    """Decode the `error` event of an event stream (the envelope, without an HTTP status)."""
    try:
        payload: Any = wire_json(data)
    except ValueError:
        payload = None
    code, message, request_id = _envelope(payload)
    if message is None:
        message = data.strip()[:200] or "the server reported an error in the stream"
    status = _CODE_STATUS.get(code or "", 500)
    return api_error(status, code, message, request_id)


def wire_json(data: str) -> Any:
    """Decode JSON text."""
    return json.loads(data)


def raise_for_status(response: httpx.Response) -> None:
    """Raise the `APIError` of a non-2xx response whose body has been read."""
    if not response.is_success:
        raise error_from_response(response)


@contextmanager
def transport_errors(label: str) -> Iterator[None]:
    """Re-raise httpx's request errors as `TransportTimeoutError` / `APIConnectionError`."""
    try:
        yield
    except httpx.TimeoutException as exc:
        raise TransportTimeoutError(f"{label}: timed out ({type(exc).__name__})") from exc
    except httpx.RequestError as exc:
        hint = ""
        if "CERTIFICATE_VERIFY_FAILED" in str(exc):
            hint = (" (the server's TLS certificate is not one a trusted CA issued: give its "
                    "CA with ca_bundle= or PANDASTACK_CA_BUNDLE)")
        raise APIConnectionError(f"{label}: {type(exc).__name__}: {exc}{hint}") from exc


# -- the calls of each operation ----------------------------------------------------------

def list_sandboxes_call(state: str | None, metadata: Mapping[str, str] | None,
                        include_ended: bool = False) -> Call[list[SandboxInfo]]:
    """`state` picks one state, ended or not; without it only live sandboxes unless
    `include_ended`. The server filters (`include_ended=false`); so does the decoder, for a
    server older than that parameter, which ignores it and lists every sandbox."""
    params = {f"metadata.{k}": v for k, v in (metadata or {}).items()}
    decode = list_decoder(wire.SandboxList, "sandboxes", SandboxInfo)
    if state is not None:
        params["state"] = state
    elif not include_ended:
        params["include_ended"] = "false"
        decode = _live_only(decode)
    return Call("GET", "/v1/sandboxes", decode, params=params or None)


def _live_only(decode: Callable[[httpx.Response], list[SandboxInfo]]
               ) -> Callable[[httpx.Response], list[SandboxInfo]]:
    def live(response: httpx.Response) -> list[SandboxInfo]:
        return [i for i in decode(response) if i.state not in wire.ENDED_STATES]
    return live


def get_sandbox_call(sandbox_id: str) -> Call[SandboxInfo]:
    return Call("GET", sandbox_path(sandbox_id), model_decoder(SandboxInfo))


#: The egress policy as the SDK takes it: a `NetworkSpec` or a mapping of its fields,
#: e.g. {"internet": False, "allow_out": ["pypi.org", "203.0.113.0/24"], "deny_out": []}.
NetworkArg = NetworkSpec | Mapping[str, Any]
#: A volume to mount in a new sandbox: `{"name", "mount_path", "read_only"}` or a VolumeMount.
VolumeArg = wire.VolumeMount | Mapping[str, Any]


def network_body(network: NetworkArg) -> dict[str, Any]:
    """A policy validated locally (`InvalidRequestError` before anything is sent)."""
    fields = network.model_dump() if isinstance(network, NetworkSpec) else dict(network)
    return encode(wire.NetworkSpec, **fields)


def create_sandbox_call(*, template: str | None, ttl_seconds: int | None, persistent: bool,
                        vcpus: int | None, memory_mb: int | None, disk_mb: int | None,
                        env: Mapping[str, str] | None, metadata: Mapping[str, str] | None,
                        snapshot: str | None = None,
                        network: NetworkArg | None = None,
                        volumes: Sequence[VolumeArg] | None = None,
                        name: str | None = None,
                        host_id: str | None = None) -> Call[SandboxInfo]:
    """From a snapshot the template and shape are the snapshot's: the default template is
    then not sent (an explicit other one is, and the server refuses it). `host_id` is for
    admin keys (the server answers a team's key 403)."""
    if snapshot is not None and template == DEFAULT_TEMPLATE:
        template = None
    body = encode(wire.CreateSandbox, template=template, ttl_seconds=ttl_seconds,
                  persistent=persistent, vcpus=vcpus, memory_mb=memory_mb, disk_mb=disk_mb,
                  env=dict(env) if env else None, metadata=dict(metadata) if metadata else None,
                  snapshot=snapshot, volumes=[v if isinstance(v, wire.VolumeMount) else dict(v)
                                              for v in volumes] if volumes else None,
                  name=name, host_id=host_id)
    if network is not None:
        body["network"] = network_body(network)
    return Call("POST", "/v1/sandboxes", model_decoder(SandboxInfo), json=body,
                span="sandbox.create")


def state_call(sandbox_id: str, action: Literal["pause", "resume", "hibernate",
                                                "wake"]) -> Call[SandboxInfo]:
    """pause / resume / hibernate / wake: the sandbox as it is afterwards."""
    return Call("POST", sandbox_path(sandbox_id, action), model_decoder(SandboxInfo), json={},
                span=f"sandbox.{action}")


def snapshot_call(sandbox_id: str, name: str | None) -> Call[SnapshotInfo]:
    return Call("POST", sandbox_path(sandbox_id, "snapshots"), model_decoder(SnapshotInfo),
                json=encode(wire.CreateSnapshot, name=name), span="sandbox.snapshot")


def fork_call(sandbox_id: str, count: int, *, durable: bool = False,
              host_id: str | None = None) -> Call[ForkResult]:
    return Call("POST", sandbox_path(sandbox_id, "fork"), model_decoder(ForkResult),
                json=encode(wire.ForkRequest, count=count, durable=durable or None,
                            host_id=host_id), span="sandbox.fork")


def list_snapshots_call() -> Call[list[SnapshotInfo]]:
    return Call("GET", "/v1/snapshots",
                list_decoder(wire.SnapshotList, "snapshots", SnapshotInfo))


def get_snapshot_call(snapshot_id: str) -> Call[SnapshotInfo]:
    return Call("GET", f"/v1/snapshots/{path_segment(snapshot_id)}", model_decoder(SnapshotInfo))


def delete_snapshot_call(snapshot_id: str) -> Call[None]:
    return Call("DELETE", f"/v1/snapshots/{path_segment(snapshot_id)}", ignore_body)


def kill_sandbox_call(sandbox_id: str) -> Call[None]:
    return Call("DELETE", sandbox_path(sandbox_id), ignore_body)


def lifecycle_call(sandbox_id: str) -> Call[Lifecycle]:
    return Call("GET", sandbox_path(sandbox_id, "lifecycle"), model_decoder(Lifecycle))


def update_lifecycle_call(sandbox_id: str, *, ttl_seconds: int | None = None,
                          persistent: bool | None = None) -> Call[Lifecycle]:
    body = encode(wire.UpdateLifecycle, ttl_seconds=ttl_seconds, persistent=persistent)
    return Call("PATCH", sandbox_path(sandbox_id, "lifecycle"), model_decoder(Lifecycle),
                json=body)


def network_call(sandbox_id: str) -> Call[NetworkSpec]:
    return Call("GET", sandbox_path(sandbox_id, "network"), model_decoder(NetworkSpec))


def update_network_call(sandbox_id: str, network: NetworkArg) -> Call[NetworkSpec]:
    """PUT: the policy becomes exactly `network` (fields left out take their defaults)."""
    return Call("PUT", sandbox_path(sandbox_id, "network"), model_decoder(NetworkSpec),
                json=network_body(network))


def _port(port: int) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise InvalidRequestError(f"port must be an integer between 1 and 65535, not {port!r}",
                                  status=422, code="validation_error")
    return port


def port_url(api_url: str, sandbox_id: str, port: int) -> str:
    """The API address of a port inside the sandbox (requests need the API key)."""
    return api_url.rstrip("/") + sandbox_path(sandbox_id, "ports", _port(port)) + "/"


def signed_url_call(sandbox_id: str, port: int, ttl_seconds: int) -> Call[SignedUrl]:
    body = encode(wire.SignedUrlRequest, ttl_seconds=ttl_seconds)
    return Call("POST", sandbox_path(sandbox_id, "ports", _port(port), "signed-url"),
                model_decoder(SignedUrl), json=body)


def logs_call(sandbox_id: str) -> Call[Logs]:
    return Call("GET", sandbox_path(sandbox_id, "logs"), model_decoder(Logs))


# -- shared state of the twins ------------------------------------------------------------

class SandboxBase(InfoFields, Generic[H]):
    """State and non-I/O behaviour shared by `Sandbox` and `AsyncSandbox`; the fields of
    `info` are properties of the handle too (sdk/_info.py)."""

    def __init__(self, info: SandboxInfo, http: H, *, owns_http: bool = False) -> None:
        self._info = info
        self._http = http
        self._owns_http = owns_http
        self._killed = False

    @property
    def id(self) -> str:
        """The sandbox id."""
        return self._info.id

    @property
    def info(self) -> SandboxInfo:
        """The sandbox as last seen (at create/connect, or the last `refresh()`)."""
        return self._info

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, state={self._info.state!r})"


class NamespaceBase(Generic[H]):
    """State shared by the `commands` / `filesystem` namespaces of both twins."""

    def __init__(self, sandbox_id: str, http: H) -> None:
        self._sandbox_id = sandbox_id
        self._http = http

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sandbox_id={self._sandbox_id!r})"


class ProcessBase(Generic[H]):
    """State shared by `Process` and `AsyncProcess`."""

    def __init__(self, sandbox_id: str, info: ProcessInfo, http: H,
                 on_stdout: Callable[[str], Any] | None = None,
                 on_stderr: Callable[[str], Any] | None = None) -> None:
        self._sandbox_id = sandbox_id
        self._info = info
        self._http = http
        # Called with each chunk as stream() or wait() reads it (sdk/_streams.py).
        self._on_output = {"stdout": on_stdout, "stderr": on_stderr}

    @property
    def pid(self) -> int:
        """The process id inside the sandbox."""
        return self._info.pid

    @property
    def info(self) -> ProcessInfo:
        """The process as reported when it was started."""
        return self._info

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sandbox_id={self._sandbox_id!r}, pid={self.pid})"


class ClientBase(Generic[H]):
    """State shared by `Client` and `AsyncClient` (and their `sandboxes`/`keys` namespaces)."""

    def __init__(self, config: ClientConfig, http: H) -> None:
        self._config = config
        self._http = http

    @property
    def api_url(self) -> str:
        """The server this client talks to."""
        return self._config.api_url

    def __repr__(self) -> str:
        return f"{type(self).__name__}(api_url={self._config.api_url!r})"
