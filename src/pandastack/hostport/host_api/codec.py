"""How the host API's JSON is written and read, and its error envelope.

Errors travel by class name: `{"error": {"type": "GuestOSError", "message": str(exc),
"attributes": {"errno_name": "ENOENT", ...}}}`. The attributes are the exception's own public
scalar attributes (GuestOSError's errno_name/message/path, SnapshotFailed's disk_switched and
no_space, BuildFailed's step/instruction/exit_code/output), nested so that none can collide
with the envelope's `message`. The client rebuilds the same class from `hostport.errors` with
the same `str()` and attributes; a name it does not know becomes a plain HostError.
"""

from __future__ import annotations

import base64
import json
from typing import Annotated, Any, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    TypeAdapter,
    WithJsonSchema,
)

from .. import errors as errors_module
from ..errors import HostError

ErrorValue = str | int | float | bool | None
T = TypeVar("T")


class HostApiModel(BaseModel):
    """A request or envelope of the host API: unknown fields are refused. The host API's own
    base, not the REST contract's (`pandastack.wire`): the two evolve apart."""

    model_config = ConfigDict(extra="forbid")


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def adapter(kind: Any) -> TypeAdapter[Any]:
    """The pydantic reader and writer of `kind`: a model, or a result dataclass of
    `hostport.results` (which cross as they are: no second model of the same value). Made
    once per kind: building one compiles its schema."""
    made = _ADAPTERS.get(kind)
    if made is None:
        made = _ADAPTERS[kind] = TypeAdapter(kind)
    return made


def dump_json(value: object) -> bytes:
    """The host API's JSON of a model, a result dataclass or plain JSON data, ASCII only.
    Strings from the guest (file names, command lines, messages) carry each byte that is not
    UTF-8 as a lone surrogate (surrogateescape); UTF-8 cannot hold those but a `\\u` escape
    can, so they cross unchanged and the control plane sees what it would see in-process."""
    if isinstance(value, BaseModel):
        data: object = value.model_dump(mode="json")
    elif hasattr(value, "__dataclass_fields__"):
        data = adapter(type(value)).dump_python(value, mode="json")
    else:
        data = value
    return json.dumps(data, ensure_ascii=True, separators=(",", ":")).encode()


def load_json(kind: type[T], payload: bytes | str) -> T:
    """The value `dump_json` wrote (pydantic's own JSON parser refuses lone surrogates)."""
    value: T = adapter(kind).validate_python(json.loads(payload))
    return value


def _bytes_or_base64(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return base64.b64decode(value, validate=True)
    raise ValueError("expected base64 text")


# Bytes in JSON: base64 there, the bytes themselves in Python (pydantic's Base64Bytes would
# also decode bytes given in Python, as if they were base64).
Base64 = Annotated[
    bytes, PlainValidator(_bytes_or_base64),
    PlainSerializer(lambda b: base64.b64encode(b).decode(), return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "contentEncoding": "base64"}),
]


class ErrorBody(HostApiModel):
    type: str = Field(description="the error's class in pandastack.hostport.errors, or "
                                  "ValueError (a request the host refused as invalid)")
    message: str
    attributes: dict[str, ErrorValue] = Field(default_factory=dict)


class ErrorEnvelope(HostApiModel):
    error: ErrorBody


def error_classes() -> dict[str, type[Exception]]:
    """Every error class the wire names: those of `hostport.errors`, and ValueError."""
    found: dict[str, type[Exception]] = {"ValueError": ValueError}
    for name, value in vars(errors_module).items():
        if isinstance(value, type) and issubclass(value, HostError):
            found[name] = value
    return found


_CLASSES = error_classes()
_BY_CLASS = {cls: name for name, cls in _CLASSES.items()}

# The HTTP status of each error (nearest class in the MRO wins). The client re-raises by
# type, not by status; statuses are for people reading logs and for generic HTTP tools.
_STATUS: dict[type[Exception], int] = {
    ValueError: 400,
    errors_module.UnsupportedLanguage: 400,
    errors_module.SandboxNotFound: 404,
    errors_module.SnapshotNotFound: 404,
    errors_module.TemplateNotFound: 404,
    errors_module.CodeContextNotFound: 404,
    errors_module.SandboxStateError: 409,
    errors_module.VolumeNotFound: 404,
    errors_module.VolumeInUse: 409,
    errors_module.CodeInterpreterUnavailable: 409,
    errors_module.CodeInterpreterError: 422,
    errors_module.GuestOSError: 422,
    errors_module.BuildFailed: 422,
    errors_module.ImageNotFound: 404,
    errors_module.RegistryAuthError: 403,
    errors_module.RegistryUnavailable: 502,
    errors_module.ImageTooLarge: 413,
    errors_module.ImageInvalid: 422,
    errors_module.VMExited: 409,
    errors_module.GuestIncompatible: 409,
    errors_module.AgentError: 502,
    errors_module.HugePagesUnavailable: 503,
    errors_module.HostUnavailable: 503,
    errors_module.HostExhausted: 503,
    errors_module.ObjectStoreUnavailable: 503,
    errors_module.ObjectNotFound: 404,
    errors_module.NoObjectStore: 409,
    HostError: 500,
}


def _wire_class(exc: BaseException) -> type[Exception] | None:
    for cls in type(exc).__mro__:
        if cls in _BY_CLASS:
            return cls
    return None


def status_of(exc: BaseException) -> int:
    for cls in type(exc).__mro__:
        if cls in _STATUS:
            return _STATUS[cls]
    return 500


def encode_error(exc: BaseException) -> ErrorEnvelope:
    """The envelope of `exc`. An exception that is neither a HostError nor a ValueError is a
    bug in the host: it goes as a HostError naming its class."""
    cls = _wire_class(exc)
    if cls is None:
        return ErrorEnvelope(error=ErrorBody(
            type="HostError", message=f"internal error in the host agent: "
                                      f"{type(exc).__name__}: {exc}"))
    attributes = {key: value for key, value in vars(exc).items()
                  if not key.startswith("_")
                  and (value is None or isinstance(value, str | int | float | bool))}
    return ErrorEnvelope(error=ErrorBody(type=_BY_CLASS[cls], message=str(exc),
                                         attributes=attributes))


def decode_error(body: ErrorBody) -> Exception:
    """The exception `body` names, with its message and attributes (not raised)."""
    cls = _CLASSES.get(body.type, HostError)
    if cls is ValueError:
        return ValueError(body.message)
    # Not through __init__: the message is already formatted (GuestOSError, SnapshotFailed
    # prefix theirs), and the attributes are set as they were.
    exc = cls.__new__(cls, body.message)
    exc.args = (body.message,)
    for key, value in body.attributes.items():
        setattr(exc, key, value)
    return exc
